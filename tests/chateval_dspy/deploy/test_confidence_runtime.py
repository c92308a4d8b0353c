"""A confidence on every verdict at run time: results lines, the saved calibration.json, withheld
verdicts (``needs_person``) and coverage, the Judge, ``serve`` and the MLflow feedback.

The fake LM's verdicts follow the answers' lengths, so items whose answers differ more in length get larger score
margins and higher raw confidence: enough spread to put a threshold between them.
"""

from __future__ import annotations

import json
import math

import dspy
import pytest
from confidence_items import FEW, FITTED_ON, IDENTITY, ITEMS
from fastapi.testclient import TestClient

from chateval_dspy import limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.mlflow.assessments import feedback_parts
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import Verdict, load
from chateval_dspy.deploy.saved.store import CALIBRATION_FILE, CARD_FILE, CARD_MD, load_program, save_calibration, save_program
from chateval_dspy.deploy.serving.http import create_app
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.confidence import (
    NEEDS_PERSON,
    Calibration,
    ConfidenceMap,
    evidence,
    raw_confidence,
)
from chateval_dspy.program.task import builtin_task
from chateval_dspy.run import identity
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.table import summary_table
from chateval_dspy.testing.fake_lm import fake_lm

CFG = DebateConfig(roles=("critic",), turns=1)  # 2 calls per item (both answer orders)
ITEM = {"id": "a", "question": "Which?", "answer_1": "short", "answer_2": "a considerably longer answer"}


def run_eval(items, program, cfg=CFG, **kwargs):
    with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):
        return evaluate(program, items, cfg, **kwargs)


def lines(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def calibrated_program(calibration, cfg=CFG):
    program = build_evaluator(cfg)
    program.calibration = calibration
    return program


# ---------------------------------------------------------------- results lines


def test_every_results_line_carries_its_confidence_raw_when_uncalibrated(tmp_path):
    out = tmp_path / "r.jsonl"
    run_eval(ITEMS, build_evaluator(CFG), out=out)
    got = lines(out)
    assert len(got) == len(ITEMS)
    for line in got:
        expected = raw_confidence(evidence(line, "pairwise")["preference"])
        assert isinstance(line["raw_confidence"], float) and 0 <= line["raw_confidence"] <= 1
        assert line["raw_confidence"] == pytest.approx(expected)
        assert line["confidence"] == line["raw_confidence"] and line["confidence_calibrated"] is False
        assert "withheld" not in line and line["abstained"] is None
    assert len({round(x["raw_confidence"], 6) for x in got}) > 2  # the fake's margins differ: a threshold can split them


def test_pointwise_lines_carry_one_confidence_per_criterion(tmp_path):
    cfg = DebateConfig(format="pointwise", roles=("critic",), turns=1)
    human = {"naturalness": 2.0, "coherence": 2.0, "engagingness": 3.0, "groundedness": 1.0}
    inputs = builtin_task("pointwise").input_names
    examples = [dspy.Example(id=f"s{i}", dialogue_history=f"A: hi {i}", fact="cats purr", response=r,
                             human=human).with_inputs(*inputs) for i, r in enumerate(["cats purr", "dogs"])]
    out = tmp_path / "s.jsonl"
    run_eval(examples, build_evaluator(cfg), cfg, out=out)
    for line in lines(out):
        assert set(line["confidence"]) == set(human) == set(line["raw_confidence"])
        assert all(0 <= v <= 1 for v in line["confidence"].values())


def test_a_line_without_a_verdict_has_no_confidence(tmp_path):
    def broken(call):
        return "not json at all"

    out = tmp_path / "r.jsonl"
    with dspy.context(lm=fake_lm(broken), adapter=DebateAdapter()):
        evaluate(build_evaluator(DebateConfig(roles=("critic",), turns=1, parse_retries=0)), ITEMS[:1], CFG, out=out)
    (line,) = lines(out)
    assert line["prediction"] is None and line["confidence"] is None and line["raw_confidence"] is None


# ---------------------------------------------------------------- withheld verdicts and coverage


def test_a_threshold_withholds_low_confidence_verdicts_as_needs_person_and_coverage_is_reported(tmp_path):
    plain = tmp_path / "plain.jsonl"
    run_eval(ITEMS, build_evaluator(CFG), out=plain)
    raws = sorted(x["raw_confidence"] for x in lines(plain))
    threshold = raws[len(raws) // 2]  # about half the items clear it
    cal = Calibration(IDENTITY, threshold=threshold, level=0.85, risk=0.1, fitted_on=FITTED_ON)
    out = tmp_path / "cal.jsonl"
    result = run_eval(ITEMS, calibrated_program(cal), out=out)
    got = lines(out)
    withheld = [x for x in got if x["abstained"] == NEEDS_PERSON]
    given = [x for x in got if x["prediction"] is not None]
    assert len(withheld) + len(given) == len(ITEMS) and withheld and given
    assert all(x["confidence"] < threshold and x["withheld"] in ("1", "2", "tie") and "correct" not in x
               for x in withheld)
    assert all(x["confidence"] >= threshold and x["confidence_calibrated"] is True for x in given)
    # agreement over the verdicts given only; the withheld ones are an abstention of their own cause
    assert result.human == [x["human"] for x in given] and result.metrics(n_resamples=FEW)["n"] == len(given)
    assert result.abstention_counts()["items"] == {NEEDS_PERSON: len(withheld)}
    cost = result.cost()
    assert cost["coverage"] == pytest.approx(len(given) / len(ITEMS))
    assert cost["coverage_ci_low"] < cost["coverage"] < cost["coverage_ci_high"] and cost["needs_person_items"] == len(withheld)
    assert cost["mean_confidence"] == pytest.approx(sum(x["confidence"] for x in given) / len(given))
    table = summary_table(result.metrics(n_resamples=FEW), cost, {"model": "fake"},
                          abstentions=result.abstention_counts())
    assert "coverage (share of items given a verdict)" in table and "exact 95% CI" in table
    assert f"{len(withheld)} withheld as needs_person" in table and "mean confidence of the verdicts given" in table


def test_without_a_threshold_every_verdict_is_given_with_its_calibrated_confidence(tmp_path):
    squeeze = ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.2, 0.6), n=50)
    out = tmp_path / "r.jsonl"
    result = run_eval(ITEMS, calibrated_program(Calibration(squeeze, fitted_on=FITTED_ON)), out=out)
    for line in lines(out):
        assert line["prediction"] is not None and line["confidence_calibrated"] is True
        assert line["confidence"] == pytest.approx(0.2 + 0.4 * line["raw_confidence"])
    assert "coverage" not in result.cost() and result.abstention_counts()["items"] == {}


# ---------------------------------------------------------------- resuming and run keys


def test_old_style_results_lines_still_resume(tmp_path):
    out = tmp_path / "r.jsonl"
    program = build_evaluator(CFG)
    run_eval(ITEMS[:5], program, out=out, run_key="one-run")  # a run judged in parts: its key is given
    old = []
    for line in lines(out):  # as a line was before confidences: none of the new fields
        old.append({k: v for k, v in line.items() if k not in ("raw_confidence", "confidence", "confidence_calibrated")})
    out.write_text("".join(json.dumps(x) + "\n" for x in old), encoding="utf-8")
    result = run_eval(ITEMS, program, out=out, run_key="one-run")
    assert result.resumed == 5 and result.n == len(ITEMS)
    got = lines(out)
    assert [x["id"] for x in got] == [x.id for x in ITEMS]
    assert all("confidence" not in x for x in got[:5]) and all("confidence" in x for x in got[5:])
    assert result.cost()["mean_raw_confidence"] == pytest.approx(sum(x["confidence"] for x in got[5:]) / 3)


def test_the_run_key_is_unchanged_without_a_calibration_and_differs_with_one(tmp_path):
    lm = {"model": "fake/scripted", "temperature": 0.0}
    state = build_evaluator(CFG).dump_state()
    from chateval_dspy.data.splits import dataset_hash

    before = identity.digest({"config": CFG.changes(), **lm, "items": dataset_hash(ITEMS),
                             "program": identity.digest(state)})  # the key as it was computed before calibrations
    assert identity.run_key(CFG, lm, ITEMS, state) == before
    assert identity.run_key(CFG, lm, ITEMS, state, None) == before
    cal = Calibration(IDENTITY, fitted_on=FITTED_ON)
    assert identity.run_key(CFG, lm, ITEMS, state, cal.to_dict()) != before
    # a file written without a calibration is not resumed by the calibrated program, nor mixed into its results
    out = tmp_path / "r.jsonl"
    run_eval(ITEMS[:2], build_evaluator(CFG), out=out)
    with pytest.raises(ConfigError, match="another run"):
        run_eval(ITEMS[:2], calibrated_program(cal), out=out)


# ---------------------------------------------------------------- the saved calibration


@pytest.fixture
def saved(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic", "scientist"), turns=1))
    return save_program(program, tmp_path / "prog", make_card(program, model="fake/card-model"))


def test_a_saved_calibration_round_trips_and_gives_calibrated_confidence(saved, engine):
    assert load_program(saved)[0].calibration is None  # no calibration.json: none
    cal = Calibration(ConfidenceMap(raw=(0.2, 0.9), calibrated=(0.55, 0.95), method="platt", n=50), fitted_on=FITTED_ON)
    path = save_calibration(saved, cal)
    assert path == saved / CALIBRATION_FILE and path.is_file()
    program, card = load_program(saved)
    assert program.calibration == cal
    assert card["calibration"] == {"method": "platt", "breakpoints": 2, "threshold": None, "level": None, "risk": None,
                                   "fitted_on": FITTED_ON}
    assert "calibrated by a platt map of 2 breakpoints" in (saved / CARD_MD).read_text()
    with load(saved) as judge:
        verdict = judge(ITEM)
        assert judge.calibration == cal
    assert verdict.confidence_calibrated is True and verdict.winner == "2"
    assert verdict.confidence == pytest.approx(cal.confidence(verdict.raw_confidence))
    # saving the program again keeps it; saving another program over the directory drops it
    save_program(program, saved, card)
    assert load_program(saved)[0].calibration == cal
    save_program(build_evaluator(program.config, program.roles), saved, card)
    assert not (saved / CALIBRATION_FILE).exists() and load_program(saved)[0].calibration is None


def _forge(saved, data):
    save_calibration(saved, Calibration(IDENTITY, threshold=0.5, level=0.85, risk=0.1, fitted_on=FITTED_ON))
    (saved / CALIBRATION_FILE).write_text(json.dumps(data), encoding="utf-8")


GOOD = {"map": IDENTITY.to_dict(), "threshold": 0.5, "level": 0.85, "risk": 0.1, "fitted_on": FITTED_ON}


@pytest.mark.parametrize(("data", "needles"), [
    ({**GOOD, "map": {**IDENTITY.to_dict(), "calibrated": [0.9, 0.1]}}, ["confidence map field 'calibrated'", "decrease"]),
    ({**GOOD, "threshold": 2.0}, ["calibration field 'threshold'", "[0, 1]"]),
    ({**GOOD, "threshold": None}, ["calibration field 'threshold'", "together"]),
    ({**GOOD, "level": float("nan")}, ["calibration field 'level'"]),
    ({**GOOD, "fitted_on": {"data": "x" * 5000}}, ["fitted_on.data"]),
    ({**GOOD, "api_base": "http://evil"}, ["exactly map, threshold, level, risk, fitted_on"]),
    ({**GOOD, "threshold": 0.4}, ["does not match", CARD_FILE]),  # valid, but not what the card says
])
def test_a_forged_calibration_is_refused_on_load(saved, engine, data, needles):
    _forge(saved, data)
    for loader in (load_program, load):
        with pytest.raises(ConfigError) as err:
            loader(saved)
        assert CALIBRATION_FILE in str(err.value) and all(n in str(err.value) for n in needles), str(err.value)


def test_a_huge_calibration_file_is_refused_before_it_is_read(saved):
    _forge(saved, GOOD)
    with open(saved / CALIBRATION_FILE, "r+b") as f:
        f.truncate(10 * 1024**2)  # 10 MB, sparse
    with pytest.raises(ConfigError, match="MAX_CALIBRATION_FILE_BYTES"):
        load_program(saved)
    assert limits.MAX_CALIBRATION_FILE_BYTES < 10 * 1024**2


def test_a_card_that_claims_a_calibration_without_its_file_is_refused(saved):
    _forge(saved, GOOD)
    (saved / CALIBRATION_FILE).unlink()
    with pytest.raises(ConfigError, match="calibration.json is missing"):
        load_program(saved)
    card = json.loads((saved / CARD_FILE).read_text())
    card["calibration"]["threshold"] = 7
    (saved / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ConfigError, match="calibration field 'threshold'"):
        load_program(saved)


# ---------------------------------------------------------------- serve and MLflow feedback


def test_serve_returns_confidence_and_the_abstention(saved, engine):
    flat = ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.3, 0.3), n=50)  # every verdict is 30% likely to agree
    save_calibration(saved, Calibration(flat, threshold=0.5, level=0.85, risk=0.1, fitted_on=FITTED_ON))
    with load(saved) as judge:
        client = TestClient(create_app(judge))
        got = client.post("/evaluate", json=ITEM).json()
        assert got["winner"] is None and got["abstained"] == NEEDS_PERSON and got["withheld"] == "2"
        assert got["confidence"] == pytest.approx(0.3) and got["confidence_calibrated"] is True
        assert 0 <= got["raw_confidence"] <= 1
        assert client.get("/card").json()["calibration"]["threshold"] == 0.5
    save_calibration(saved, Calibration(flat, fitted_on=FITTED_ON))  # no threshold: the verdict is given
    with load(saved) as judge:
        got = TestClient(create_app(judge)).post("/evaluate", json=[ITEM]).json()[0]
    assert got["winner"] == "2" and got["abstained"] is None and got["confidence"] == pytest.approx(0.3)


def test_mlflow_feedback_carries_the_confidence_in_metadata_and_the_rationales_first_line():
    line = {"id": "a", "format": "pairwise", "prediction": "1", "score_1": 8.0, "score_2": 3.0, "consistent": True,
            "abstained": None, "referees": {"critic": [{"score_1": 8, "score_2": 3}]}, "calls": 2, "prompt_tokens": 5,
            "completion_tokens": 1, "seconds": 0.1, "raw_confidence": 0.9, "confidence": 0.8125,
            "confidence_calibrated": True}
    from chateval_dspy.program.task import as_task

    task = as_task("pairwise")
    parts = feedback_parts(Verdict.from_record(line, task), task, expected="1")
    main = parts[0]
    assert main["value"] == "answer_1" and main["metadata"]["chateval.confidence"] == "0.8125"
    assert main["metadata"]["chateval.confidence_calibrated"] == "true"
    assert "confidence 0.812 (calibrated" in main["rationale"].splitlines()[0]
    withheld = {**line, "prediction": None, "withheld": "1", "abstained": NEEDS_PERSON, "confidence": 0.4}
    parts = feedback_parts(Verdict.from_record(withheld, task), task, expected="1")
    first = parts[0]["rationale"].splitlines()[0]
    assert parts[0]["value"] is None and NEEDS_PERSON in parts[0]["error"]
    assert NEEDS_PERSON in first and "confidence 0.400" in first and "prefers answer_1" in first
    agreement = [p for p in parts if p["name"].endswith("/agreement")]
    assert agreement[0]["value"] is None  # agreement is over the verdicts given
    assert json.loads(parts[0]["metadata"]["chateval.withheld"]) == "1"


def test_calibration_checks_its_own_fields():
    with pytest.raises(ConfigError, match="together"):
        Calibration(IDENTITY, threshold=0.5)
    cal = Calibration(IDENTITY, threshold=0.5, level=0.85, risk=0.1)
    assert cal.gives(0.5) and not cal.gives(0.49) and not cal.gives(None) and Calibration(IDENTITY).gives(None)
    assert not math.isnan(cal.confidence(0.25))


def test_a_hand_edited_confidence_in_a_results_line_counts_as_none():
    from chateval_dspy.run.result import RunResult

    result = RunResult(CFG)
    base = {"human": "1", "prediction": "1", "calls": 2, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0,
            "abstained": None, "confidence_calibrated": True}
    for confidence in ("lots", {"a": "x", "b": 0.5}, 7.0, float("nan"), True, 0.75):
        result.add({**base, "confidence": confidence})
    assert result.confidences == [0.75] and result.cost()["mean_confidence"] == 0.75


def test_a_calibration_changes_the_evaluator_digest_of_ray_and_spark_results(saved):
    from chateval_dspy.deploy.scale.parts import evaluator_digest

    program = load_program(saved)[0]
    before = evaluator_digest(program)
    save_calibration(saved, Calibration(IDENTITY, fitted_on=FITTED_ON))
    assert evaluator_digest(load_program(saved)[0]) != before
    assert evaluator_digest(program) == before  # no calibration: the digest it always had
