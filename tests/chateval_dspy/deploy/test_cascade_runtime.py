"""A cascade at run time: saved and loaded, checked as untrusted input, routing items stage by stage,
in ``score_file`` (resumable, and refusing another run's file), in batch mode stage by stage, and in ``serve``.

The fake LM's verdicts follow the answers' lengths: an item whose answers differ much in length gets a wide score
margin and a high raw confidence, one of equal lengths a tie and a lower one. Every stage is calibrated with the
identity map, so its confidence is the raw one, and thresholds are put between the two kinds of items as measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from chateval_dspy import limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.cascade import (
    CASCADE_FILE,
    CascadeJudge,
    is_cascade,
    read_cascade,
    save_cascade,
    stage_dir,
)
from chateval_dspy.deploy.saved.judge import Verdict, load
from chateval_dspy.deploy.saved.store import CALIBRATION_FILE, save_calibration, save_program
from chateval_dspy.deploy.saved.verdicts import verdict_frame
from chateval_dspy.deploy.scale import parts
from chateval_dspy.deploy.scale.score_file import score_file
from chateval_dspy.deploy.serving.http import create_app
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.confidence import NEEDS_PERSON, Calibration, ConfidenceMap

SINGLE = DebateConfig(roles=("critic",), turns=1)  # 2 calls an item, one wave
PANEL = DebateConfig(roles=("critic", "scientist"), turns=1)  # 4 calls an item, two waves
IDENTITY = ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.0, 1.0), method="isotonic", n=50)
FITTED_ON = {"data": "faireval", "split": "calibration", "n": 50}
EASY = [{"id": f"easy{i}", "question": f"q{i}?", "answer_1": "a" * (50 + i), "answer_2": "b" * 5} for i in range(2)]
HARD = [{"id": f"hard{i}", "question": f"h{i}?", "answer_1": "c" * 30, "answer_2": "d" * 30} for i in range(2)]


def evaluator(tmp_path: Path, name: str, cfg: DebateConfig, model: str, threshold: float | None = None) -> Path:
    """A saved, calibrated evaluator (its own threshold, if any, is one a cascade must ignore)."""
    program = build_evaluator(cfg)
    where = save_program(program, tmp_path / "evaluators" / name, make_card(program, model=model))
    guarantee = {"threshold": threshold, "level": 0.9, "risk": 0.1} if threshold is not None else {}
    save_calibration(where, Calibration(IDENTITY, fitted_on=FITTED_ON, **guarantee))
    return where


@pytest.fixture
def stages(tmp_path):
    return [("single", evaluator(tmp_path, "single", SINGLE, "fake/cheap", threshold=0.999)),
            ("panel", evaluator(tmp_path, "panel", PANEL, "fake/strong"))]


def given(v: Verdict):
    """The verdict an evaluator reached, given or withheld by its own threshold."""
    return v.withheld if v.abstained == NEEDS_PERSON else v.winner


def alone(path, items, model: str | None = None) -> list[Verdict]:
    with load(path, lm=LMSpec(model=model, cache=False)) as judge:
        return [judge(x) for x in items]


@pytest.fixture
def split(stages, engine):
    """A threshold between the easy items' and the hard items' confidence, for each stage (as measured alone)."""
    out = []
    for _, path in stages:
        easy = min(v.confidence for v in alone(path, EASY))
        hard = max(v.confidence for v in alone(path, HARD))
        assert hard < easy, "the fake must give the easy items more confidence than the hard ones"
        out.append((hard + easy) / 2)
    return out


def cascade(tmp_path, stages, thresholds, name="cascade", **kwargs) -> Path:
    save_cascade(tmp_path / name, stages, thresholds, level=0.85, risk=0.1, **kwargs)
    return tmp_path / name


# ---------------------------------------------------------------- save and load


def test_a_saved_cascade_round_trips_and_loads_as_a_cascade_judge(tmp_path, stages, engine):
    path = save_cascade(tmp_path / "c", stages, [0.9, None], level=0.85, risk=0.1, report={"usd_per_1000": 0.4})
    assert path == tmp_path / "c" / CASCADE_FILE and is_cascade(tmp_path / "c") and not is_cascade(stages[0][1])
    spec = read_cascade(tmp_path / "c")
    assert (spec.level, spec.risk, spec.report) == (0.85, 0.1, {"usd_per_1000": 0.4})
    assert [(s.name, s.threshold, s.dir) for s in spec.stages] == [
        ("single", 0.9, stage_dir(tmp_path / "c", 1, "single")), ("panel", None, stage_dir(tmp_path / "c", 2, "panel"))]
    with load(tmp_path / "c", lm=LMSpec(cache=False)) as judge:
        assert isinstance(judge, CascadeJudge) and judge.spec == spec and judge.calibration is None
        assert [j.lm.model for j in judge.stages] == ["fake/cheap", "fake/strong"]  # each on its card's model
        assert judge.card["cascade"]["stages"][0] == {"name": "single", "threshold": 0.9}
        # the stage's own threshold (0.999) is not the cascade's: its map stays, its threshold goes
        assert judge.stages[0].calibration.map == IDENTITY and judge.stages[0].calibration.threshold is None
        assert judge.task.format == "pairwise" and judge.format == "pairwise"
    # saving again over the cascade replaces it; over anything else is refused
    save_cascade(tmp_path / "c", stages[:1], [0.5], level=0.8, risk=0.2)
    assert [s.name for s in read_cascade(tmp_path / "c").stages] == ["single"]
    assert not stage_dir(tmp_path / "c", 2, "panel").exists()
    with pytest.raises(ConfigError, match="other than a saved cascade"):
        save_cascade(stages[1][1], stages[:1], [0.5], level=0.8, risk=0.2)


@pytest.mark.filterwarnings("ignore:this evaluator was compiled for")
def test_stage_models_and_model_choose_each_stages_lm(tmp_path, stages, engine):
    where = cascade(tmp_path, stages, [0.9, None])
    with load(where, lm=LMSpec(cache=False), stage_models={"panel": "fake/other"}) as judge:
        assert [j.lm.model for j in judge.stages] == ["fake/cheap", "fake/other"]
    with load(where, lm=LMSpec(model="fake/all", cache=False)) as judge:
        assert [j.lm.model for j in judge.stages] == ["fake/all", "fake/all"]
    with pytest.raises(ConfigError, match="'nope'"):
        load(where, stage_models={"nope": "fake/x"})
    with pytest.raises(ConfigError, match="not a cascade"):
        load(stages[0][1], stage_models={"single": "fake/x"})


def test_save_cascade_refuses_what_a_loader_would(tmp_path, stages):
    program = build_evaluator(SINGLE)
    bare = save_program(program, tmp_path / "bare", make_card(program, model="fake/cheap"))
    with pytest.raises(ConfigError, match="has no calibration.json"):
        save_cascade(tmp_path / "c", [("bare", bare)], [0.5], level=0.8, risk=0.1)
    with pytest.raises(ConfigError, match=r"stages\[1\].name"):
        save_cascade(tmp_path / "c", [("Bad Name", stages[0][1])], [0.5], level=0.8, risk=0.1)
    with pytest.raises(ConfigError, match="'level'"):
        save_cascade(tmp_path / "c", stages, [0.5, None], level=1.0, risk=0.1)
    with pytest.raises(ConfigError, match="2 stage.* 1 threshold"):
        save_cascade(tmp_path / "c", stages, [0.5], level=0.8, risk=0.1)
    assert not (tmp_path / "c").exists()


def _pointwise_stage(tmp_path) -> Path:
    return evaluator(tmp_path, "pointwise", DebateConfig(format="pointwise", roles=("critic",), turns=1), "fake/x")


def _tamper(where: Path, how: str, tmp_path: Path) -> None:
    path = where / CASCADE_FILE
    data = json.loads(path.read_text())
    edits = {
        "threshold above 1": lambda d: d["stages"][0].update(threshold=1.5),
        "threshold a boolean": lambda d: d["stages"][0].update(threshold=True),
        "risk of 0": lambda d: d.update(risk=0),
        "a path in a name": lambda d: d["stages"][0].update(name="../../elsewhere"),
        "a newline in a name": lambda d: d["stages"][0].update(name="single\n"),
        "an unknown key": lambda d: d.update(api_base="http://evil"),
        "a key in a stage": lambda d: d["stages"][0].update(dir="/etc"),
        "too many stages": lambda d: d.update(stages=[{"name": f"s{i}", "threshold": 0.5} for i in range(9)]),
        "another format": lambda d: d.update(format="something-else"),
    }
    if how in edits:
        edits[how](data)
        path.write_text(json.dumps(data))
    elif how == "cascade.json a symlink":
        moved = tmp_path / "elsewhere.json"
        path.rename(moved)
        path.symlink_to(moved)
    elif how == "a stage a symlink":
        real = tmp_path / "outside"
        stage_dir(where, 1, "single").rename(real)
        stage_dir(where, 1, "single").symlink_to(real, target_is_directory=True)
    elif how == "a stage's card a symlink":
        card = stage_dir(where, 2, "panel") / "card.json"
        card.rename(tmp_path / "card.json")
        card.symlink_to(tmp_path / "card.json")
    elif how == "oversize":
        with open(path, "r+b") as f:
            f.truncate(limits.MAX_CASCADE_FILE_BYTES + 10)
    elif how == "a stage of another task":
        other = stage_dir(where, 2, "panel")
        for f in other.iterdir():
            f.unlink()
        for f in _pointwise_stage(tmp_path).iterdir():
            (other / f.name).write_bytes(f.read_bytes())
    elif how == "a stage without calibration":
        (stage_dir(where, 2, "panel") / CALIBRATION_FILE).unlink()


@pytest.mark.parametrize(("how", "needle"), [
    ("threshold above 1", "stages[1].threshold"),
    ("threshold a boolean", "stages[1].threshold"),
    ("risk of 0", "'risk'"),
    ("a path in a name", "stages[1].name"),
    ("a newline in a name", "stages[1].name"),
    ("an unknown key", "report optional"),
    ("a key in a stage", "exactly name and threshold"),
    ("too many stages", "MAX_CASCADE_STAGES"),
    ("another format", "'format'"),
    ("cascade.json a symlink", "symbolic link"),
    ("a stage a symlink", "symbolic link"),
    ("a stage's card a symlink", "symbolic link"),
    ("oversize", "MAX_CASCADE_FILE_BYTES"),
    ("a stage of another task", "same task"),
    ("a stage without calibration", "needs its calibration.json"),
])
def test_a_tampered_cascade_is_refused_on_load(tmp_path, stages, engine, how, needle):
    where = cascade(tmp_path, stages, [0.9, None])
    _tamper(where, how, tmp_path)
    for loader in (read_cascade, load):
        with pytest.raises(ConfigError) as err:
            loader(where)
        assert needle in str(err.value), str(err.value)
    assert not engine.calls  # refused before any LM call


# ---------------------------------------------------------------- routing


def test_a_stage_keeps_its_confident_items_and_the_rest_go_on(tmp_path, stages, split, engine):
    where = cascade(tmp_path, stages, [split[0], 0.0])
    first, second = alone(stages[0][1], EASY + HARD), alone(stages[1][1], HARD)
    engine.calls.clear()
    with load(where, lm=LMSpec(cache=False)) as judge:
        got = [judge(x) for x in EASY] + [judge(**HARD[0]), judge(HARD[1])]
    for v, solo in zip(got[:2], first[:2]):
        assert (v.stage, v.stages_run, v.winner) == ("single", ["single"], given(solo))
        assert v.confidence == pytest.approx(solo.confidence) and v.confidence >= split[0]
        assert (v.calls, v.prompt_tokens) == (solo.calls, solo.prompt_tokens)
    for v, one, two in zip(got[2:], first[2:], second):
        assert (v.stage, v.stages_run, v.winner, v.abstained) == ("panel", ["single", "panel"], given(two), None)
        # what the item cost is the sum over the stages that judged it
        assert v.calls == one.calls + two.calls and v.prompt_tokens == one.prompt_tokens + two.prompt_tokens
        assert v.completion_tokens == one.completion_tokens + two.completion_tokens
        assert {m: u["calls"] for m, u in v.usage_by_model.items()} == {"fake/cheap": one.calls, "fake/strong": two.calls}
    assert len(engine.calls) == sum(v.calls for v in got)


def test_an_item_no_stage_keeps_needs_a_person_with_the_last_verdict_withheld(tmp_path, stages, split, engine):
    where = cascade(tmp_path, stages, [split[0], None])  # the panel gives no verdict of its own
    (panel,) = alone(stages[1][1], HARD[:1])
    with load(where, lm=LMSpec(cache=False)) as judge:
        v = judge(HARD[0])
        kept = judge(EASY[0])
    assert (v.winner, v.abstained, v.withheld, v.stage) == (None, NEEDS_PERSON, given(panel), None)
    assert v.stages_run == ["single", "panel"] and v.confidence == pytest.approx(panel.confidence)
    assert kept.stage == "single" and kept.abstained is None


# ---------------------------------------------------------------- score_file, evaluate_batch, serve


def _rows(tmp_path, rows) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def test_score_file_resumes_a_cascade_and_refuses_a_mixed_results_file(tmp_path, stages, split, engine):
    where = cascade(tmp_path, stages, [split[0], 0.0])
    src, out = _rows(tmp_path, [*EASY, HARD[0], {"id": "bad", "question": "q"}]), tmp_path / "out.jsonl"
    with load(where, lm=LMSpec(cache=False)) as judge:
        report = score_file(judge, src, out)
        key = parts.judge_run_key(judge)
    assert (report.scored, len(report.rejected)) == (3, 1)
    lines = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert [lines[x["id"]]["stage"] for x in [*EASY, HARD[0]]] == ["single", "single", "panel"]
    assert lines["hard0"]["stages_run"] == ["single", "panel"] and {x["run_key"] for x in lines.values()} == {key}
    calls = len(engine.calls)
    with load(where, lm=LMSpec(cache=False)) as judge:
        again = score_file(judge, src, out)
    assert (again.skipped, again.scored, len(engine.calls)) == (3, 0, calls)  # resumed: nothing judged twice
    other = cascade(tmp_path, stages, [0.0, 0.0], name="other")
    with load(other, lm=LMSpec(cache=False)) as judge, pytest.raises(ConfigError, match="another run"):
        score_file(judge, src, out)
    with load(stages[0][1], lm=LMSpec(cache=False)) as judge, pytest.raises(ConfigError, match="another run"):
        score_file(judge, src, out)  # one of its stages alone
    single_out = tmp_path / "single.jsonl"
    with load(stages[0][1], lm=LMSpec(cache=False)) as judge:
        score_file(judge, src, single_out)
    with load(where, lm=LMSpec(cache=False)) as judge, pytest.raises(ConfigError, match="another run"):
        score_file(judge, src, single_out)
    assert len(engine.calls) == calls + 3 * 2  # only the single evaluator's own file was judged


def test_evaluate_batch_and_the_pyfunc_frame_carry_the_stage(tmp_path, stages, split, engine):
    with load(cascade(tmp_path, stages, [split[0], 0.0]), lm=LMSpec(cache=False)) as judge:
        frame = judge.evaluate_batch([EASY[0], HARD[0], {"id": "x", "question": "q"}], concurrency=2, flat=True)
    out = verdict_frame(frame)
    assert list(out["stage"][:2]) == ["single", "panel"] and out["error"][2] is not None
    assert [json.loads(x) for x in out["stages_run"][:2]] == [["single"], ["single", "panel"]]
    assert out["verdict"][0] == "1"


def test_serve_returns_stage_confidence_and_abstention(tmp_path, stages, split, engine):
    with load(cascade(tmp_path, stages, [split[0], None]), lm=LMSpec(cache=False)) as judge:
        client = TestClient(create_app(judge))
        easy, hard = client.post("/evaluate", json=[EASY[0], HARD[0]]).json()
        health = client.get("/health").json()
        card = client.get("/card").json()
    assert (easy["stage"], easy["abstained"], easy["winner"]) == ("single", None, "1")
    assert easy["confidence"] >= split[0] and easy["confidence_calibrated"] is True
    assert (hard["stage"], hard["abstained"], hard["winner"]) == (None, NEEDS_PERSON, None)
    assert hard["withheld"] is not None and hard["stages_run"] == ["single", "panel"]
    assert health["stages"] == {"single": "fake/cheap", "panel": "fake/strong"}
    assert card["cascade"]["level"] == 0.85


# ---------------------------------------------------------------- batch mode


def test_batch_mode_runs_a_two_stage_cascade_stage_by_stage_in_waves(tmp_path):
    from chateval_dspy.program.critical_path import critical_path
    from chateval_dspy.testing.fake_batches import FakeBatches
    from chateval_dspy.testing.fake_server import FakeOpenAIServer

    stages = [("single", evaluator(tmp_path, "single", SINGLE, "openai-compatible/fake-served")),
              ("panel", evaluator(tmp_path, "panel", PANEL, "openai-compatible/fake-served"))]
    items = EASY + HARD
    src, out, fake = _rows(tmp_path, items), tmp_path / "out.jsonl", FakeBatches()
    with FakeOpenAIServer(batches=fake) as url:
        firsts = alone(stages[0][1], items, model=url)
        threshold = (min(v.confidence for v in firsts[:2]) + max(v.confidence for v in firsts[2:])) / 2
        where = cascade(tmp_path, stages, [threshold, 0.0])
        with load(where, lm=LMSpec(model=url, cache=False)) as judge:
            live = {x["id"]: judge(x) for x in items}
        with load(where, lm=LMSpec(model=url, cache=False, batch=True, batch_poll=0.02),
                  journal=Path(f"{out}.batches")) as judge:
            report = score_file(judge, src, out, concurrency=4, waves=True)
    assert report.scored == len(items)
    got = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert {i: (x["stage"], x["winner"]) for i, x in got.items()} == {i: (v.stage, v.winner) for i, v in live.items()}
    assert [got[x["id"]]["stage"] for x in items] == ["single", "single", "panel", "panel"]
    # stage 1's waves over every item, then stage 2's over the items stage 1 did not keep, and no more
    chain1, chain2 = critical_path(SINGLE)["chain"], critical_path(PANEL)["chain"]
    assert len(fake.created) == chain1 + chain2
    per_batch = [len(fake.requests_in(b)) for b in fake.created]
    assert per_batch[:chain1] == [len(items) * critical_path(SINGLE)["calls"] // chain1] * chain1
    assert sum(per_batch[chain1:]) == len(HARD) * critical_path(PANEL)["calls"]
    assert sorted(os.listdir(f"{out}.batches")) == ["1-single", "2-panel"]  # a journal per stage


def test_the_mlflow_judge_accepts_a_cascade_and_names_the_stage_in_its_feedback(tmp_path, stages, split, engine):
    from chateval_dspy.deploy.mlflow.judge import mlflow_judge

    with load(cascade(tmp_path, stages, [split[0], None]), lm=LMSpec(cache=False)) as judge:
        scorer = mlflow_judge(judge)
        assert "stage single" in scorer.instructions and "stage panel" in scorer.instructions
        easy, *_ = scorer(inputs={k: v for k, v in EASY[0].items() if k != "id"})
        hard, *_ = scorer(inputs={k: v for k, v in HARD[0].items() if k != "id"})
        with pytest.raises(ConfigError, match="trace=True"):
            mlflow_judge(judge, trace=True)
    assert easy.value == "answer_1" and easy.metadata["chateval.stage"] == "single"
    assert easy.source.source_id == "chateval:fake/cheap+fake/strong"
    assert hard.value is None and hard.metadata["chateval.abstained"] == NEEDS_PERSON
    assert json.loads(hard.metadata["chateval.stages_run"]) == ["single", "panel"]


@pytest.mark.filterwarnings("ignore:this evaluator was compiled for")
def test_a_results_directory_of_ray_and_spark_tells_a_cascade_from_its_stages(tmp_path, stages, split, engine):
    where, out = cascade(tmp_path, stages, [split[0], 0.0]), parts.results_dir(tmp_path / "parts")
    identity, done, _ = parts.begin(out, str(where), ["easy0", "hard0"])
    with load(where, lm=LMSpec(cache=False)) as judge:
        assert parts.saved_digest(str(where)) == identity.evaluator == parts.judge_digest(judge)  # driver, worker agree
        writer = parts.PartWriter(out, parts.stamp(judge, identity, out))
        counts = parts.judge_rows(judge, [EASY[0], HARD[0]], set(done), writer, concurrency=2, source="test")
        writer.close()
    assert counts["scored"] == 2
    got = parts.read_results(out).set_index("id")
    assert list(got.loc[["easy0", "hard0"], "stage"]) == ["single", "panel"]
    with pytest.raises(ConfigError, match="another evaluator"):
        parts.begin(out, str(stages[0][1]), ["easy0"])  # one of its stages
    with pytest.raises(ConfigError, match="another evaluator"):
        parts.begin(out, str(cascade(tmp_path, stages, [0.0, 0.0], name="other")), ["easy0"])
    identity, done, _ = parts.begin(out, str(where), ["easy0", "hard0"])
    assert done == {"easy0", "hard0"}
    with load(where, lm=LMSpec(model="fake/elsewhere", cache=False)) as judge, pytest.raises(ConfigError, match="another run"):
        parts.stamp(judge, identity, out)  # the same cascade on other models


def test_a_cascade_fetched_from_mlflow_loads_and_its_download_goes_with_the_judge(tmp_path, stages, engine, monkeypatch):
    """A run's ``evaluator`` artifact may be a cascade: ``load("runs:/...")`` fetches it (here, a copy stands in for
    MLflow's download) and removes the download when the judge closes."""
    import shutil

    import chateval_dspy.deploy.saved.fetch as fetch
    import chateval_dspy.deploy.saved.judge as judge_module

    where = cascade(tmp_path, stages, [0.9, None])
    assert fetch._evaluator_in(where, "runs:/r", False) == where  # what the artifacts hold, found as MLflow's would be
    seen = []

    def download(uri, workdir, trust_pickle):
        seen.append(shutil.copytree(where, workdir / "run"))
        return fetch._evaluator_in(seen[-1], uri, trust_pickle)

    monkeypatch.setattr(judge_module, "from_mlflow", download)
    with load("runs:/abc/evaluator", lm=LMSpec(cache=False)) as judge:
        assert isinstance(judge, CascadeJudge) and judge(EASY[0]).stages_run[0] == "single"
        assert seen[0].is_dir()
    assert not seen[0].exists()


def test_a_pointwise_cascade_gives_a_verdict_whole_by_its_least_confident_criterion(tmp_path, engine):
    from chateval_dspy.testing.fake_lm import default_responder

    def split_on_naturalness(call):  # the two referees agree on every criterion but naturalness
        out = default_responder(call)
        if "naturalness" in out:
            out["naturalness"] = 1 if "critic" in call.inputs.get("persona", "").lower() else 3
        return out

    engine.responder = split_on_naturalness
    cfg = DebateConfig(format="pointwise", roles=("critic", "scientist"), turns=1)
    first, second = evaluator(tmp_path, "first", cfg, "fake/cheap"), evaluator(tmp_path, "second", cfg, "fake/strong")
    item = {"id": "p", "dialogue_history": "A: do cats purr?", "fact": "cats purr", "response": "cats purr, yes"}
    (solo,) = alone(first, [item])
    least = min(solo.confidence.values())
    assert least < max(solo.confidence.values())  # the criteria differ: the least confident one decides
    with load(cascade(tmp_path, [("first", first), ("second", second)], [least, None]), lm=LMSpec(cache=False)) as judge:
        kept = judge(item)
    with load(cascade(tmp_path, [("first", first), ("second", second)], [min(1.0, least + 1e-6), None],
                      name="strict"), lm=LMSpec(cache=False)) as judge:
        passed_on = judge(item)
    assert (kept.stage, kept.scores, kept.stages_run) == ("first", solo.scores, ["first"])
    assert (passed_on.stage, passed_on.scores, passed_on.abstained) == (None, None, NEEDS_PERSON)
    assert passed_on.withheld == solo.scores and passed_on.stages_run == ["first", "second"]


def test_chateval_score_takes_a_cascade_with_tracing_on_by_default_and_refuses_trace(tmp_path, stages, split, engine,
                                                                                      capsys):
    """A trace follows one panel's debate: a cascade scores untraced where the default would trace (an MLflow
    target, a small file), and ``--trace`` asking for it is refused."""
    from optim.cli.main import main

    where, src = cascade(tmp_path, stages, [split[0], 0.0]), _rows(tmp_path, [EASY[0], HARD[0]])
    flags = ["--no-progress", "--tracking-uri", (tmp_path / "mlruns").as_uri()]
    out = tmp_path / "out.jsonl"
    assert main(["score", str(where), "--in", str(src), "--out", str(out), *flags]) == 0, capsys.readouterr().err
    stage = {x["id"]: x["stage"] for x in map(json.loads, out.read_text().splitlines())}
    assert stage == {EASY[0]["id"]: "single", HARD[0]["id"]: "panel"}
    assert main(["score", str(where), "--in", str(src), "--out", str(tmp_path / "t.jsonl"), "--trace", *flags]) != 0
    assert "is a cascade: --trace" in capsys.readouterr().err
