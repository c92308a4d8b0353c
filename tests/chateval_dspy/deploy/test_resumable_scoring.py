"""Ray and Spark scoring that resumes: verdicts by item id in a results directory, reruns pay only for
what is missing, a SIGKILLed job loses at most the items in flight, and the README subsection runs as written.

Real Ray (a local cluster of 2 CPUs) and real PySpark (``local[2]``); the LM is ``FakeOpenAIServer`` in this process,
whose ``requests`` counts the calls of every worker process.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import pandas as pd
import pytest
from readme_section import MANY_MACHINES, subsection_blocks

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.deploy.scale.parts import part_files, read_results
from chateval_dspy.errors import DataError
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_server import FakeOpenAIServer
from optim.bench.scale import kill_when_written, start_ray_job, start_spark_job, verdict_lines

pytestmark = pytest.mark.slow  # real Ray and Spark jobs

# Answer lengths decide the fake's scores: the clearly longer answer wins (odd items answer 1, even answer 2).
ITEMS = [{"id": f"i{i}", "question": f"q{i}", "answer_1": "a" * (80 if i % 2 else 10), "answer_2": "b" * 40}
         for i in range(10)]
WINNERS = {f"i{i}": "1" if i % 2 else "2" for i in range(10)}
HEADING = "Ray and Spark scoring that resumes"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    where = tmp_path_factory.mktemp("prog")
    return str(save_program(program, where / "prog", make_card(program, model="openai-compatible/fake-served")))


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray", reason="ray[data] is not installed")
    # 2 CPUs, the machine the README's example must fit: its 2 actors of num_cpus=0.5 leave a CPU to Ray Data's read
    # tasks (an actor pool that reserves every CPU starves the reads that feed it: ``check_resources`` refuses it).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def spark(tmp_path_factory, java_home):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers run this venv's Python, not the system's python3
    session = (SparkSession.builder.master("local[2]").appName("chateval-resume-test")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local"))).getOrCreate())
    yield session
    session.stop()


def chat_calls(fake: FakeOpenAIServer) -> int:
    return len(fake.requests)


def test_ray_scores_by_id_and_reruns_pay_only_for_the_missing(ray_session, saved, tmp_path):
    from chateval_dspy.deploy.scale.ray import score_dataset

    out = tmp_path / "verdicts"
    bad = {"id": "bad", "question": "q", "answer_1": "x"}  # no answer_2: an error line, never done
    with FakeOpenAIServer() as url:
        first = score_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS[:4])), saved, out=str(out), model=url,
                              batch_size=2, cache=False)
        every = ray_session.data.from_pandas(pd.DataFrame([*ITEMS, bad]))
        second = score_dataset(every, saved, out=str(out), model=url, batch_size=3, cache=False)
        third = score_dataset(every, saved, out=str(out), model=url, batch_size=3, cache=False)
    assert (first.total, first.skipped, first.scored, first.errors) == (4, 0, 4, 0)
    assert (second.total, second.skipped, second.scored, second.errors) == (11, 4, 6, 1)
    assert (third.skipped, third.scored, third.errors) == (10, 0, 1)  # the error row is judged again
    results = read_results(out).set_index("id")
    assert results.loc["bad", "error"] and verdict_lines(out) == dict.fromkeys(WINNERS, 1)
    assert results.drop(index="bad")["winner"].to_dict() == WINNERS


def test_ray_rerun_makes_calls_only_for_unfinished_items(ray_session, saved, tmp_path):
    from chateval_dspy.deploy.scale.ray import score_dataset

    out = tmp_path / "verdicts"
    with FakeOpenAIServer() as url:
        score_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS[:3])), saved, out=str(out), model=url, cache=False)
    server = FakeOpenAIServer()
    with server as url:
        report = score_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS[:5])), saved, out=str(out), model=url,
                               cache=False)
        per_item = read_results(out).set_index("id")["calls"]
        assert report.scored == 2 and chat_calls(server) == per_item.loc[["i3", "i4"]].sum()
        server.requests.clear()
        again = score_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS[:5])), saved, out=str(out), model=url,
                              cache=False)
        assert again.skipped == 5 and chat_calls(server) == 0


def test_repeated_or_missing_ids_are_refused_before_any_call(ray_session, saved, tmp_path):
    from chateval_dspy.deploy.scale.ray import score_dataset

    server = FakeOpenAIServer()
    with server as url:
        twice = ray_session.data.from_pandas(pd.DataFrame([ITEMS[0], ITEMS[1], ITEMS[0]]))
        with pytest.raises(DataError, match="1 repeated id.*'i0'"):
            score_dataset(twice, saved, out=str(tmp_path / "a"), model=url)
        unnamed = ray_session.data.from_pandas(pd.DataFrame([ITEMS[0], {**ITEMS[1], "id": None}]))
        with pytest.raises(DataError, match="row 2.*has no id"):
            score_dataset(unnamed, saved, out=str(tmp_path / "b"), model=url)
    assert server.requests == []


def test_an_actor_pool_the_cluster_cannot_hold_is_refused_before_it_starts(ray_session, saved, tmp_path):
    from chateval_dspy.deploy.scale.ray import judge_dataset, score_dataset
    from chateval_dspy.errors import ConfigError

    server = FakeOpenAIServer()
    with server as url:
        lazy = ray_session.data.from_pandas(pd.DataFrame(ITEMS)).repartition(2)  # a split task feeds the actors
        with pytest.raises(ConfigError, match=r"has 2 CPU and this job needs 3: 2 actor\(s\) x 1 CPU each"):
            score_dataset(lazy, saved, out=str(tmp_path / "out"), model=url, actors=2, ray_remote_args={"num_cpus": 1})
        with pytest.raises(ConfigError, match=r"needs 4: 3 actor\(s\) x 1 CPU"):
            judge_dataset(lazy, saved, model=url, actors=3)
    assert server.requests == [] and not part_files(tmp_path / "out")


def test_a_rerun_on_another_model_is_refused_by_the_workers_before_any_call(ray_session, spark, saved, tmp_path):
    from chateval_dspy.deploy.scale.ray import score_dataset
    from chateval_dspy.deploy.scale.spark import score_spark

    for engine in ("ray", "spark"):
        out = tmp_path / engine
        with FakeOpenAIServer() as url:
            if engine == "ray":
                score_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS[:2])), saved, out=str(out), model=url,
                              cache=False)
            else:
                score_spark(spark.createDataFrame(pd.DataFrame(ITEMS[:2])), saved, out=str(out), model=url, cache=False)
        other = FakeOpenAIServer(model="another-served")
        with other as url, pytest.raises(Exception, match="holds verdicts of another run") as refused:
            if engine == "ray":
                score_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS[:4])), saved, out=str(out), model=url,
                              cache=False)
            else:
                score_spark(spark.createDataFrame(pd.DataFrame(ITEMS[:4])), saved, out=str(out), model=url, cache=False)
        assert "another-served" in str(refused.value), engine
        assert other.requests == [], engine
        assert verdict_lines(out) == {"i0": 1, "i1": 1}, engine


def test_ray_knobs_pass_through_without_deprecation_warnings(ray_session, saved, tmp_path):
    from chateval_dspy.deploy.scale.ray import judge_dataset

    cache = tmp_path / "actor-cache"
    # Ray builds its DataContext once, warning about its own deprecated fields as it does: none of our arguments.
    ray_session.data.DataContext.get_current()
    with FakeOpenAIServer() as url, warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # RayDeprecationWarning is a DeprecationWarning
        ds = judge_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS[:2])), saved, model=url, actors=1,
                           ray_remote_args={"num_cpus": 1},
                           runtime_env={"env_vars": {"CHATEVAL_CACHE_DIR": str(cache)}})
        got = ds.to_pandas()
    assert list(got.sort_values("id")["winner"]) == ["2", "1"]
    assert any(cache.rglob("*")), "the actors' LM cache did not follow runtime_env's CHATEVAL_CACHE_DIR"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to stop the killed job's workers")
def test_a_killed_ray_job_reruns_losing_at_most_the_items_in_flight(ray_session, saved, tmp_path):
    from chateval_dspy.deploy.scale.ray import score_dataset

    out = tmp_path / "verdicts"
    server = FakeOpenAIServer(delay=0.1)
    with server as url:
        job = start_ray_job(saved, out, url, ITEMS, actors=1, per_actor=2, batch=4)
        written = kill_when_written(job, out, 3, timeout=120)
        assert 3 <= written < len(ITEMS), f"kill came too late or never: {written} lines, {job.stderr.read()[-2000:]}"
        before = chat_calls(server)
        report = score_dataset(ray_session.data.from_pandas(pd.DataFrame(ITEMS)), saved, out=str(out), model=url,
                               batch_size=4, concurrency=2, cache=False)
    assert verdict_lines(out) == dict.fromkeys(WINNERS, 1)  # every item exactly one verdict
    assert report.skipped >= 3 and report.scored == len(ITEMS) - report.skipped
    needed = int(read_results(out)["calls"].sum())
    extra = chat_calls(server) - needed
    per_item = int(read_results(out)["calls"].max())
    # in flight at the kill: at most one actor's `concurrency` (2) items, each a whole item's calls at most
    assert 0 <= extra <= 2 * per_item, (extra, per_item, before)


def test_spark_scores_by_id_and_reruns_pay_only_for_the_missing(spark, saved, tmp_path):
    from chateval_dspy.deploy.scale.spark import score_spark

    out = tmp_path / "verdicts"
    server = FakeOpenAIServer()
    with server as url:
        first = score_spark(spark.createDataFrame(pd.DataFrame(ITEMS[:4])), saved, out=str(out), model=url, cache=False)
        first_calls = chat_calls(server)
        server.requests.clear()
        every = spark.createDataFrame(pd.DataFrame(ITEMS)).repartition(2)
        second = score_spark(every, saved, out=str(out), model=url, cache=False)
        results = read_results(out).set_index("id")
        assert chat_calls(server) == results.loc[[f"i{i}" for i in range(4, 10)], "calls"].sum()
        server.requests.clear()
        third = score_spark(every, saved, out=str(out), model=url, cache=False)
        assert chat_calls(server) == 0
    assert (first.scored, first_calls > 0) == (4, True)
    assert (second.total, second.skipped, second.scored, second.errors) == (10, 4, 6, 0)
    assert (third.skipped, third.scored) == (10, 0)
    assert verdict_lines(out) == dict.fromkeys(WINNERS, 1)
    assert results["winner"].to_dict() == WINNERS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to stop the killed job's workers")
def test_a_killed_spark_job_reruns_losing_at_most_the_items_in_flight(spark, saved, tmp_path):
    from chateval_dspy.deploy.scale.spark import score_spark

    out = tmp_path / "verdicts"
    server = FakeOpenAIServer(delay=0.1)
    with server as url:
        job = start_spark_job(saved, out, url, ITEMS, per_task=2)
        written = kill_when_written(job, out, 3, timeout=150)
        assert 3 <= written < len(ITEMS), f"kill came too late or never: {written} lines, {job.stderr.read()[-2000:]}"
        report = score_spark(spark.createDataFrame(pd.DataFrame(ITEMS)), saved, out=str(out), model=url, cache=False)
    assert verdict_lines(out) == dict.fromkeys(WINNERS, 1)
    assert report.scored == len(ITEMS) - report.skipped
    results = read_results(out)
    extra, per_item = chat_calls(server) - int(results["calls"].sum()), int(results["calls"].max())
    # in flight at the kill: local[2] runs 2 tasks (partitions) at once, each judging `concurrency` (2) items
    assert 0 <= extra <= 2 * 2 * per_item, (extra, per_item)


def test_spark_resumes_after_a_torn_part(spark, saved, tmp_path):
    from chateval_dspy.deploy.scale.spark import score_spark

    out = tmp_path / "verdicts"
    with FakeOpenAIServer() as url:
        score_spark(spark.createDataFrame(pd.DataFrame(ITEMS[:2])), saved, out=str(out), model=url, cache=False)
    with open(part_files(out)[0], "a") as part:
        part.write('{"id": "i2", "winner": "1", "calls"')  # a kill in the middle of a line
    server = FakeOpenAIServer()
    with server as url:
        report = score_spark(spark.createDataFrame(pd.DataFrame(ITEMS[:3])), saved, out=str(out), model=url, cache=False)
    assert (report.skipped, report.scored) == (2, 1)
    assert verdict_lines(out) == {"i0": 1, "i1": 1, "i2": 1}


def test_the_readme_blocks_run_as_written(ray_session, spark, saved, tmp_path, monkeypatch):
    blocks = [code for lang, code in subsection_blocks(MANY_MACHINES, HEADING) if lang == "python"]
    assert len(blocks) == 2, "the subsection has one Ray block and one Spark block"
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(x) + "\n" for x in ITEMS))
    monkeypatch.chdir(tmp_path)
    server = FakeOpenAIServer()
    with server as url:
        # The blocks name the deployment's own values; the test binds them: the fake LM's URL, the saved
        # evaluator, the items file, and a cache directory under tmp_path.
        names = {"URL": url, "EVALUATOR": saved, "ITEMS": str(items), "CACHE": str(tmp_path / "cache")}
        for code in blocks:
            exec(compile(code, "README.md", "exec"), dict(names))  # noqa: S102 - the README's own example
        assert verdict_lines(tmp_path / "verdicts-ray") == dict.fromkeys(WINNERS, 1)
        assert verdict_lines(tmp_path / "verdicts-spark") == dict.fromkeys(WINNERS, 1)
        assert any((tmp_path / "cache").rglob("*"))
