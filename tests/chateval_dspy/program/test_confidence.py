"""A confidence on every verdict: evidence from a prediction and from a results line, the fixed
raw summary, the calibrated map read as untrusted input, its fit, the calibration error and the reliability diagram."""

from __future__ import annotations

import json
import math
import re

import dspy
import numpy as np
import pytest

import chateval_dspy.limits as limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.confidence import (
    ConfidenceMap,
    Evidence,
    agrees,
    criterion_evidence,
    evidence,
    pairwise_evidence,
    raw_confidence,
)
from chateval_dspy.program.task import Scale, TaskSpec, builtin_task
from chateval_dspy.run.evaluate import result_record
from chateval_dspy.testing.fake_lm import fake_lm
from optim.tuning.confidence import (
    calibration_error,
    calibration_pairs,
    expected_calibration_error,
    fit_confidence_map,
    reliability_diagram,
)

# One referee sure of answer 1 in both orders (with token probabilities in the first), one that flips with the order.
REFEREES = {
    "critic": [{"preference": "1", "score_1": 9, "score_2": 3, "expected": {"score_1": 8.5, "score_2": 3.0}},
               {"preference": "1", "score_1": 8, "score_2": 4}],
    "general_public": [{"preference": "1", "score_1": 6, "score_2": 5}, None],
}


def test_pairwise_evidence_from_a_hand_built_prediction():
    pred = dspy.Prediction(preference="1", score_1=7.67, score_2=4.0, consistent=False,
                           order_preferences=["1", "1"], referees=REFEREES)
    ev = evidence(pred, "pairwise")["preference"]
    assert ev.agreement == pytest.approx(3 / 4)  # the abstention counts against the verdict
    assert ev.consistent is False and ev.verdicts == 3
    assert ev.margin == pytest.approx(((8.5 - 3) / 9 + (8 - 4) / 9 + (6 - 5) / 9) / 3)  # expected scores where given
    assert ev.token_certainty == pytest.approx((0.5 + 1.0) / 2)
    assert ev.spread is None
    # The same verdict seen against answer 2 has no support: no referee voted for it, and its margin is negative.
    against = pairwise_evidence("2", REFEREES, False)
    assert against.agreement == 0 and against.margin == pytest.approx(-ev.margin)
    assert raw_confidence(against) < raw_confidence(ev)


def test_a_results_line_gives_the_same_evidence_as_the_prediction():
    pred = dspy.Prediction(preference="1", consistent=False, referees=REFEREES)
    line = json.loads(json.dumps({"prediction": "1", "consistent": False, "referees": REFEREES}))
    assert evidence(line, "pairwise") == evidence(pred, "pairwise")


def test_a_tie_is_supported_by_equal_scores_only():
    tie = pairwise_evidence("tie", {"a": [{"preference": "tie", "score_1": 5, "score_2": 5}]})
    split = pairwise_evidence("tie", {"a": [{"preference": "tie", "score_1": 9, "score_2": 0}]})
    assert tie.margin == 0 and split.margin == pytest.approx(-1.0)


def test_no_verdict_has_no_confidence():
    ev = pairwise_evidence(None, {"a": [None, None]}, None)
    assert ev == Evidence(agreement=0.0, verdicts=0) and raw_confidence(ev) == 0


def test_a_live_run_and_its_results_line_agree(tmp_path):
    cfg = DebateConfig(roles=("general_public", "critic"), turns=1)
    item = dspy.Example(id="x", label="1", question="q?", answer_1="a" * 80, answer_2="b" * 10
                        ).with_inputs(*builtin_task("pairwise").input_names)
    with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):
        pred = build_evaluator(cfg)(**item.inputs())
        line = json.loads(json.dumps(result_record(build_evaluator(cfg), item, cfg)))
    live = evidence(pred, cfg.task_spec)["preference"]
    assert live == evidence(line, cfg.task_spec)["preference"]
    # The fake judges by length: both referees prefer the long answer in both orders.
    assert (live.agreement, live.consistent, live.verdicts) == (1.0, True, 4)
    assert live.margin > 0 and raw_confidence(live) > 0.9


# ---- pointwise ------------------------------------------------------------------------------------------------

def test_pointwise_agreement_with_people_is_a_tolerance_on_integer_scales_and_equality_on_labels():
    one_to_five, passfail = Scale(1, 5), Scale(labels=("pass", "fail"))
    assert agrees(3.0, 3, one_to_five) and agrees(2.5, 2.67, one_to_five) and agrees(2.5, 3, one_to_five)
    assert agrees(2.0, 3, one_to_five) is False and agrees(2.0, 3, one_to_five, tolerance=1.0)
    assert agrees("pass", "pass", passfail) and agrees("pass", "fail", passfail) is False
    assert agrees(None, 3, one_to_five) is None and agrees(3, None, one_to_five) is None


def test_pointwise_confidence_falls_as_referees_spread():
    close = {"a": [{"naturalness": 2}], "b": [{"naturalness": 2}], "c": [{"naturalness": 2}]}
    apart = {"a": [{"naturalness": 1}], "b": [{"naturalness": 2}], "c": [{"naturalness": 3}]}
    tight, loose = criterion_evidence(2.0, close, "naturalness"), criterion_evidence(2.0, apart, "naturalness")
    assert (tight.agreement, tight.spread) == (1.0, 0.0)
    assert loose.agreement == pytest.approx(1 / 3) and loose.spread == pytest.approx(math.sqrt(2 / 3))
    assert raw_confidence(tight) == 1.0 > raw_confidence(loose)


def test_pointwise_evidence_per_criterion_from_a_prediction_and_a_line():
    task = TaskSpec.from_dict({"name": "rag", "format": "pointwise",
        "inputs": [{"name": "question"}, {"name": "answer", "judged": True}],
        "criteria": [{"name": "faithful", "description": "no invented claims", "scale": ["pass", "fail"]},
                     {"name": "relevance", "description": "it answers the question", "scale": "1-5"}]})
    referees = {"a": [{"faithful": "pass", "relevance": 4}], "b": [{"faithful": "fail", "relevance": 5}],
                "c": [None]}
    pred = dspy.Prediction(faithful="pass", relevance=4.5, referees=referees)
    line = {"prediction": {"faithful": "pass", "relevance": 4.5}, "referees": referees}
    got = evidence(pred, task)
    assert got == evidence(line, task) and set(got) == {"faithful", "relevance"}
    assert got["faithful"].agreement == pytest.approx(1 / 3) and got["faithful"].spread is None
    assert got["relevance"].agreement == pytest.approx(2 / 3) and got["relevance"].spread == pytest.approx(0.25)
    abstained = evidence({"prediction": None, "referees": {"a": [None]}}, task)
    assert all(raw_confidence(ev) == 0 for ev in abstained.values())


def test_raw_confidence_is_monotone_in_each_kind_of_evidence():
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, m, s, t = rng.uniform(size=4)
        base = raw_confidence(Evidence(agreement=a, consistent=False, margin=m - 0.5, token_certainty=t))
        assert 0 <= base <= 1
        assert raw_confidence(Evidence(agreement=min(1, a + 0.1), consistent=False, margin=m - 0.5,
                                       token_certainty=t)) >= base
        assert raw_confidence(Evidence(agreement=a, consistent=True, margin=m - 0.5, token_certainty=t)) >= base
        assert raw_confidence(Evidence(agreement=a, consistent=False, margin=m, token_certainty=t)) >= base
        spread = raw_confidence(Evidence(agreement=a, spread=s))
        assert raw_confidence(Evidence(agreement=a, spread=min(1, s + 0.1))) <= spread


# ---- the calibrated map, read as untrusted input --------------------------------------------------------------

def good_map() -> dict:
    return {"method": "isotonic", "n": 50, "raw": [0.1, 0.5, 0.9], "calibrated": [0.4, 0.6, 0.95]}


def read_map(tmp_path, data, text=None) -> ConfidenceMap:
    path = tmp_path / "program.json"
    path.write_text(text if text is not None else json.dumps({"confidence": data}), encoding="utf-8")
    parsed = limits.parse_json(path.read_text(encoding="utf-8"), str(path))
    return ConfidenceMap.from_dict(parsed["confidence"], str(path))


def test_a_map_survives_its_dict_and_interpolates(tmp_path):
    cmap = read_map(tmp_path, good_map())
    assert cmap.to_dict() == good_map()
    assert cmap(0.0) == 0.4 and cmap(1.0) == 0.95 and cmap(0.3) == pytest.approx(0.5)


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"calibrated": [0.4, 0.9, 0.6]}, "calibrated", "must not decrease"),
    ({"raw": [0.1, 0.9, 0.5]}, "raw", "strictly increasing"),
    ({"raw": [0.1, 0.1, 0.5]}, "raw", "strictly increasing"),
    ({"raw": [0.1, 0.5, 1.5]}, "raw", "in [0, 1]"),
    ({"calibrated": [0.4, True, 0.9]}, "calibrated", "in [0, 1]"),
    ({"calibrated": [0.4, 0.6]}, "calibrated", "one value per breakpoint"),
    ({"raw": []}, "raw", "1 to 1024"),
    ({"raw": "0.1"}, "raw", "1 to 1024"),
    ({"method": "magic"}, "method", "isotonic, platt"),
    ({"n": -1}, "n", "count"),
])
def test_a_bad_map_is_refused_naming_source_and_field(tmp_path, change, field, problem):
    with pytest.raises(ConfigError, match=rf"program\.json: confidence map field '{field}': .*{re.escape(problem)}"):
        read_map(tmp_path, {**good_map(), **change})


def test_a_nan_in_a_map_file_is_refused(tmp_path):
    text = '{"confidence": {"method": "isotonic", "n": 5, "raw": [0.1, NaN], "calibrated": [0.2, 0.3]}}'
    with pytest.raises(ConfigError, match=r"program\.json: confidence map field 'raw': .*got nan"):
        read_map(tmp_path, None, text)


def test_an_oversized_map_is_refused_before_its_values_are_read(tmp_path):
    n = limits.MAX_CONFIDENCE_BREAKPOINTS + 1
    grid = [i / n for i in range(n)]
    with pytest.raises(ConfigError, match="MAX_CONFIDENCE_BREAKPOINTS"):
        read_map(tmp_path, {**good_map(), "raw": grid, "calibrated": grid})


def test_a_map_with_unknown_or_missing_fields_is_refused():
    with pytest.raises(ConfigError, match="src: a confidence map has the fields"):
        ConfidenceMap.from_dict({**good_map(), "endpoint": "http://x"}, "src")
    with pytest.raises(ConfigError, match="src: a confidence map is a mapping"):
        ConfidenceMap.from_dict([0.1], "src")


# ---- fitting and measuring --------------------------------------------------------------------------------------

def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw confidences that carry signal but are miscalibrated: people agree with probability 0.3 + 0.6 raw^3."""
    rng = np.random.default_rng(seed)
    raw = rng.uniform(size=n)
    return raw, rng.uniform(size=n) < 0.3 + 0.6 * raw ** 3


@pytest.mark.parametrize("method", ["isotonic", "platt"])
def test_a_fitted_map_lowers_the_calibration_error_on_fresh_items(method):
    fit_raw, fit_agreed = synthetic(2000, seed=1)
    raw, agreed = synthetic(2000, seed=2)
    cmap = fit_confidence_map(fit_raw, fit_agreed, method)
    before = expected_calibration_error(raw, agreed)
    after = expected_calibration_error([cmap(r) for r in raw], agreed)
    assert before > 0.1 and after < before / 2
    # Isotonic assumes no shape; Platt's logistic curve only approximates the cubic truth.
    assert after < (0.05 if method == "isotonic" else 0.07)
    assert list(cmap.calibrated) == sorted(cmap.calibrated) and cmap.n == 2000 and cmap.method == method
    assert ConfidenceMap.from_dict(json.loads(json.dumps(cmap.to_dict())), "saved") == cmap


def test_a_fit_on_many_distinct_values_stays_within_the_breakpoint_limit():
    rng = np.random.default_rng(3)
    raw = np.sort(rng.uniform(size=5000))
    cmap = fit_confidence_map(raw, np.arange(5000) % 7 != 0)  # agreements rising in no order: many small blocks
    assert 1 <= len(cmap.raw) <= limits.MAX_CONFIDENCE_BREAKPOINTS


def test_a_platt_curve_that_would_fall_is_the_agreement_rate():
    raw = np.linspace(0, 1, 100)
    cmap = fit_confidence_map(raw, raw < 0.3, "platt")
    assert list(cmap.calibrated) == pytest.approx([0.3] * len(cmap.calibrated))


def test_fitting_refuses_nothing_to_fit_and_unknown_methods():
    with pytest.raises(ConfigError, match="no labelled verdicts"):
        fit_confidence_map([], [])
    with pytest.raises(ConfigError, match="one length"):
        fit_confidence_map([0.1, 0.2], [True])
    with pytest.raises(ConfigError, match="unknown calibration method 'beta'"):
        fit_confidence_map([0.1], [True], "beta")


def test_calibration_error_matches_a_hand_computation():
    confidence, agreed = [0.05, 0.15, 0.95, 0.95, 1.0], [False, True, True, False, True]
    # Bins [0, .1): |0 - .05| x 1/5; [.1, .2): |1 - .15| x 1/5; [.9, 1]: |2/3 - .9667| x 3/5.
    hand = 0.05 / 5 + 0.85 / 5 + abs(2 / 3 - (0.95 + 0.95 + 1.0) / 3) * 3 / 5
    estimate = calibration_error(confidence, agreed, resamples=200)
    assert estimate.value == pytest.approx(hand) and estimate.n == 5
    assert estimate.low <= estimate.value <= estimate.high
    assert calibration_error(confidence, agreed, resamples=200) == estimate  # seeded


def test_calibration_pairs_from_results_lines():
    lines = [
        {"prediction": "1", "human": "1", "consistent": True, "referees": {"a": [{"score_1": 9, "score_2": 2}]}},
        {"prediction": "2", "human": "1", "consistent": True, "referees": {"a": [{"score_1": 4, "score_2": 5}]}},
        {"prediction": "1", "human": None, "referees": {"a": [{"score_1": 9, "score_2": 2}]}},
    ]
    confidence, agreed = calibration_pairs(lines, "pairwise")
    assert agreed == [True, False] and confidence[0] > confidence[1]
    cmap = ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.5, 0.5))
    assert calibration_pairs(lines, "pairwise", cmap=cmap)[0] == [0.5, 0.5]
    human = {"naturalness": 2, "coherence": 1, "engagingness": None, "groundedness": 1}
    line = {"prediction": {"naturalness": 2.0, "coherence": 3.0, "engagingness": 2.0, "groundedness": 1.0},
            "human": human, "referees": {"a": [{"naturalness": 2, "coherence": 3, "engagingness": 2, "groundedness": 1}]}}
    assert calibration_pairs([line], "pointwise")[1] == [True, False, True]  # engagingness: no person's label


def test_the_reliability_diagram_is_written(tmp_path):
    raw, agreed = synthetic(300, seed=4)
    path = reliability_diagram(raw, agreed, tmp_path / "reliability.png", "raw confidence",
                               model="fake/scripted", data="synthetic", split="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
