"""Run identity of Ray and Spark results directories: every line carries the evaluator's digest and
the run key; lines of another evaluator or run, or with none, are refused naming their file; a damaged line in the
middle of a part is skipped and counted, not fatal; the directory is locked before anything else; the cluster's
resources are checked before Ray waits forever; and an actor's LM calls in flight can be bounded.

The driver's and the workers' steps are called directly (``parts.begin``, ``parts.stamp``, ``parts.judge_rows``),
on a real loaded evaluator against the scripted fake LM server: no Ray or Spark cluster is needed here (the real
ones run in tests/chateval_dspy/deploy/test_resumable_scoring.py).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import types
from pathlib import Path

import pytest

from chateval_dspy.concurrency import parallel_map
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import load
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.deploy.scale import parts
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.run.locks import exclusive
from chateval_dspy.testing.fake_server import FakeOpenAIServer

ITEMS = [{"id": f"i{i}", "question": f"q{i}", "answer_1": "a" * (80 if i % 2 else 10), "answer_2": "b" * 40}
         for i in range(4)]
IDS = [x["id"] for x in ITEMS]


def saved_evaluator(where: Path, roles=("critic",)) -> str:
    program = build_evaluator(DebateConfig(roles=roles, turns=1))
    return str(save_program(program, where, make_card(program, model="openai-compatible/fake-served")))


@pytest.fixture
def saved(tmp_path):
    return saved_evaluator(tmp_path / "prog")


def run(out: Path, evaluator: str, items: list[dict], url: str):
    """One run as the driver and one worker make it: lock, read, stamp, judge; the report."""
    with parts.run_lock(out):
        identity, done, report = parts.begin(out, evaluator, [x["id"] for x in items])
        with load(evaluator, lm=LMSpec(model=url, cache=False)) as judge:
            writer = parts.PartWriter(out, parts.stamp(judge, identity, out))
            counts = parts.judge_rows(judge, items, done, writer, concurrency=2, source="test")
            writer.close()
    report.scored += counts["scored"]
    return report


def lines_of(out: Path) -> list[dict]:
    return [json.loads(line) for part in parts.part_files(out) for line in part.read_text().splitlines()]


def test_every_line_carries_the_evaluator_and_the_run_key(saved, tmp_path):
    out = parts.results_dir(tmp_path / "out")
    with FakeOpenAIServer() as url:
        assert run(out, saved, ITEMS[:2], url).scored == 2
    stamps = {(line["evaluator"], line["run_key"]) for line in lines_of(out)}
    assert len(stamps) == 1 and next(iter(stamps))[0] == parts.saved_digest(saved)


def test_a_forged_verdict_for_an_item_never_judged_does_not_count(saved, tmp_path):
    out = parts.results_dir(tmp_path / "out")
    with FakeOpenAIServer() as url:
        run(out, saved, ITEMS[:2], url)
    (out / "part-zz-forged.jsonl").write_text(json.dumps({"id": "i3", "winner": "1"}) + "\n")
    with pytest.raises(ConfigError, match=r"part-zz-forged\.jsonl line 1 carries no run identity"):
        parts.begin(out, saved, IDS)
    with pytest.raises(ConfigError, match="part-zz-forged"):
        parts.read_results(out)


def test_a_forged_part_that_sorts_first_cannot_override_a_real_verdict(saved, tmp_path):
    out = parts.results_dir(tmp_path / "out")
    with FakeOpenAIServer() as url:
        run(out, saved, ITEMS[:2], url)
    real = parts.read_results(out).set_index("id")["winner"].to_dict()
    forged = {"id": "i0", "winner": "1" if real["i0"] != "1" else "2", "evaluator": "0" * 12, "run_key": "0" * 12}
    (out / "part-0-forged.jsonl").write_text(json.dumps(forged) + "\n")
    assert parts.part_files(out)[0].name == "part-0-forged.jsonl"
    with pytest.raises(ConfigError, match=r"another evaluator"):
        parts.read_results(out)


def test_another_evaluator_cannot_resume_or_mix_into_a_directory(saved, tmp_path):
    out = parts.results_dir(tmp_path / "out")
    other = saved_evaluator(tmp_path / "other", roles=("general_public",))
    server = FakeOpenAIServer()
    with server as url:
        run(out, saved, ITEMS[:2], url)
        server.requests.clear()
        with pytest.raises(ConfigError, match=r"part-.*line 1 was written by another evaluator"):
            run(out, other, ITEMS, url)
    assert server.requests == []  # refused on the driver, before any LM call


def test_a_worker_on_another_model_or_evaluator_refuses_before_any_call(saved, tmp_path):
    out = parts.results_dir(tmp_path / "out")
    with FakeOpenAIServer() as url:
        run(out, saved, ITEMS[:2], url)
        with load(saved, lm=LMSpec(model=url, cache=False)) as judge:
            identity, _, _ = parts.begin(out, saved, IDS)
            assert parts.stamp(judge, identity, out)["run_key"] == identity.run_key
            moved = types.SimpleNamespace(program=judge.program, lm=types.SimpleNamespace(model="openai/other",
                                                                                           kwargs={}), referee_lms={})
            with pytest.raises(ConfigError, match="holds verdicts of another run"):
                parts.stamp(moved, identity, out)
            with pytest.raises(ConfigError, match="other than the one the driver read"):
                parts.stamp(judge, parts.RunIdentity("f" * 12, identity.run_key), out)


def test_a_rerun_with_every_id_done_still_refuses_another_model(saved, tmp_path):
    out = parts.results_dir(tmp_path / "out")
    with FakeOpenAIServer() as url:
        run(out, saved, ITEMS[:2], url)
        identity, done, report = parts.begin(out, saved, IDS[:2])
        assert report.skipped == report.total == 2 and done == set(IDS[:2])
        parts.check_finished(out, saved, url, identity, cache=False)  # the same model: nothing to refuse
    other = FakeOpenAIServer(model="another-served")
    with other as url, pytest.raises(ConfigError, match="holds verdicts of another run.*another-served"):
        parts.check_finished(out, saved, url, identity, cache=False)
    assert other.requests == []


def test_a_torn_line_in_the_middle_is_skipped_counted_and_judged_again(saved, tmp_path, caplog):
    out = parts.results_dir(tmp_path / "out")
    server = FakeOpenAIServer()
    with server as url:
        run(out, saved, ITEMS[:3], url)
        part = parts.part_files(out)[0]
        lines = part.read_text().splitlines(keepends=True)
        lines[1] = lines[1][: len(lines[1]) // 2] + "\n"  # torn in the middle of the file
        part.write_text("".join(lines) + '{"id": "i3", "win')  # and a torn last line, as a killed worker leaves
        torn_id = json.loads(lines[0])["id"], json.loads(lines[2])["id"]
        with caplog.at_level(logging.WARNING, logger="chateval_dspy.deploy.scale.parts"):
            report = run(out, saved, ITEMS, url)
    assert (report.total, report.skipped, report.torn, report.scored) == (4, 2, 1, 2)
    assert "line 2" in caplog.text and "judged again" in caplog.text
    assert part.read_text().endswith("\n")  # the torn last line was cut
    results = parts.read_results(out)
    assert sorted(results["id"]) == IDS and set(torn_id) <= set(results["id"])


def test_verdicts_of_one_id_in_two_parts_resolve_to_the_part_that_sorts_first(saved, tmp_path, caplog):
    out = parts.results_dir(tmp_path / "out")
    with FakeOpenAIServer() as url:
        run(out, saved, ITEMS[:1], url)
    first = parts.part_files(out)[0]
    line = json.loads(first.read_text())
    (out / "part-zzz-retried.jsonl").write_text(json.dumps({**line, "winner": "tie"}) + "\n")
    with caplog.at_level(logging.WARNING, logger="chateval_dspy.deploy.scale.parts"):
        got = parts.read_results(out)
    assert got["winner"].tolist() == [line["winner"]] and "part whose name sorts first counts" in caplog.text


class Untouchable:
    """A dataset that fails the test if a scoring call reads it."""

    def select_columns(self, *_):
        raise AssertionError("the dataset was read before the results directory was locked")

    select = select_columns


@pytest.mark.parametrize("engine", ["ray", "spark"])
def test_the_results_directory_is_locked_before_the_ids_are_collected(engine, saved, tmp_path):
    out = parts.results_dir(tmp_path / "out")
    held, release = threading.Event(), threading.Event()

    def other_run():
        with exclusive(out / "run"):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=other_run)
    holder.start()
    held.wait(30)
    try:
        if engine == "ray":
            from chateval_dspy.deploy.scale.ray import score_dataset as score
        else:
            from chateval_dspy.deploy.scale.spark import score_spark as score
        with pytest.raises(ConfigError, match="being written by another"):
            score(Untouchable(), saved, out=str(out))
    finally:
        release.set()
        holder.join()


class Materialized:
    """Stands for ``ray.data.MaterializedDataset`` (``from_pandas``): no task needs to run to feed the actors."""


def fake_ray(monkeypatch, resources: dict) -> None:
    dataset = types.SimpleNamespace(MaterializedDataset=Materialized)
    data = types.SimpleNamespace(dataset=dataset)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(
        is_initialized=lambda: True, cluster_resources=lambda: resources, data=data))
    monkeypatch.setitem(sys.modules, "ray.data", data)
    monkeypatch.setitem(sys.modules, "ray.data.dataset", dataset)


def test_an_actor_pool_the_cluster_cannot_hold_is_refused_saying_what_to_change(monkeypatch):
    from chateval_dspy.deploy.scale.ray import check_resources

    fake_ray(monkeypatch, {"CPU": 2.0, "memory": 8e9})
    lazy = object()  # read_json(...).repartition(4): read and split tasks need a CPU beside the actors
    with pytest.raises(ConfigError, match=r"has 2 CPU and this job needs 3: 2 actor\(s\) x 1 CPU each .*"
                                          r"\+ 1 CPU for the Ray Data tasks that feed them .*Use fewer actors, a "
                                          r"smaller 'num_cpus'"):
        check_resources(2, {"num_cpus": 1}, lazy)
    with pytest.raises(ConfigError, match=r"has 0 GPU and this job needs 1"):
        check_resources(1, {"num_gpus": 1}, lazy)
    check_resources(2, {"num_cpus": 0.5}, lazy)  # 2 x 0.5 + 1 for the reads: fits
    check_resources(2, {"num_cpus": 1}, Materialized())  # nothing to read: the actors may take every CPU
    check_resources(1, None, lazy)


def test_max_in_flight_bounds_an_actors_lm_calls(saved, tmp_path):
    """An item's calls run in parallel (orders x referees): ``max_in_flight`` bounds them across the items at once."""
    state = {"now": 0, "most": 0}
    guard, crowded = threading.Lock(), threading.Event()

    def call(bound: int, wait: float):
        with guard:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            if state["now"] > bound:
                crowded.set()
        crowded.wait(wait)  # unbounded: held until more than `bound` are in flight together
        with guard:
            state["now"] -= 1

    def judge_with(bound: int, wait: float):
        def judge(record, source):  # two answer orders, each with three referees speaking at once
            parallel_map(lambda _: parallel_map(lambda _: call(bound, wait), [1, 2, 3], 3), [1, 2], 2)
            return types.SimpleNamespace(to_dict=lambda: {"id": record["id"], "winner": "1"})
        return judge

    writer = types.SimpleNamespace(append=lambda line: None)
    parts.judge_rows(judge_with(3, 30), ITEMS, set(), writer, concurrency=4, source="t")
    assert state["most"] > 3  # what an actor does unbounded: items x orders x referees
    state["most"], bounded = 0, judge_with(3, 0.02)
    crowded.clear()
    counts = parts.judge_rows(bounded, ITEMS, set(), writer, concurrency=4, source="t", max_in_flight=3)
    assert counts["scored"] == 4 and 1 <= state["most"] <= 3


@pytest.mark.parametrize("engine", ["ray", "spark"])
def test_a_bound_of_no_calls_is_refused_before_anything_runs(engine, saved, tmp_path):
    if engine == "ray":
        from chateval_dspy.deploy.scale.ray import score_dataset as score
    else:
        from chateval_dspy.deploy.scale.spark import score_spark as score
    with pytest.raises(ConfigError, match=r"max_in_flight: LM calls in flight must be a whole number of 1 or more"):
        score(Untouchable(), saved, out=str(tmp_path / "out"), max_in_flight=0)
