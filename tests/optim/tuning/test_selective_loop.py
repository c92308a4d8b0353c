"""Selective verdicts, the loop back to people: a verdict withheld for a person
still counts in a refit of the confidence, ranks first in ``chateval review`` and reads as the panel's leaning
there, comes back as a label through ``--labels mlflow:``; results of an evaluator before and after its calibration
are never mixed; the summary and the MLflow metrics state the coverage.

The fake LM's verdicts follow the answers' lengths (``chateval_dspy.testing.fake_lm.default_responder``), so items
whose answers differ more in length get larger score margins and a higher confidence: enough spread to put a
threshold between them.
"""

from __future__ import annotations

import json

import dspy
import pytest
from chateval_cli import chateval_captured
from confidence_items import FEW, FITTED_ON, IDENTITY, ITEMS  # the same items and map

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import load
from chateval_dspy.deploy.saved.store import save_calibration, save_program
from chateval_dspy.deploy.scale.score_file import score_file
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.confidence import NEEDS_PERSON, Calibration, ConfidenceMap
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.table import summary_table
from chateval_dspy.testing.fake_lm import fake_lm
from optim.review.desk import ReviewItem
from optim.review.page import panel_text
from optim.review.uncertainty import rank, uncertainty
from optim.tracking.runs import metric_values
from optim.tuning.calibrate import fit, given_pairs
from optim.tuning.confidence import calibration_pairs

CFG = DebateConfig(roles=("critic",), turns=1)  # 2 calls per item (both answer orders)
SQUEEZE = ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.2, 0.9), method="isotonic", n=50)


def run_eval(items, program, **kwargs):
    with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):
        return evaluate(program, items, CFG, **kwargs)


def lines(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def calibrated(calibration):
    program = build_evaluator(CFG)
    program.calibration = calibration
    return program


def middle_threshold(path) -> float:
    """A threshold that about half the verdicts of an uncalibrated results file clear (identity map)."""
    raws = sorted(x["raw_confidence"] for x in lines(path))
    assert raws[0] < raws[-1], "the fake LM must give confidences that differ, or no threshold splits them"
    return raws[len(raws) // 2]


def with_threshold(threshold: float, cmap: ConfidenceMap = IDENTITY) -> Calibration:
    return Calibration(cmap, threshold=threshold, level=0.85, risk=0.1, fitted_on=FITTED_ON)


@pytest.fixture
def both(tmp_path):
    """The same items judged by the plain evaluator and by one that withholds about half its verdicts."""
    plain, selective = tmp_path / "plain.jsonl", tmp_path / "selective.jsonl"
    run_eval(ITEMS, build_evaluator(CFG), out=plain)
    run_eval(ITEMS, calibrated(with_threshold(middle_threshold(plain))), out=selective)
    got = lines(selective)
    assert any(x["abstained"] == NEEDS_PERSON for x in got) and any(x["prediction"] is not None for x in got)
    return lines(plain), got


# ---------------------------------------------------------------- 1. refitting counts the withheld verdicts


def test_a_withheld_verdict_counts_in_the_calibration_pairs_with_the_panels_verdict(both):
    plain, selective = both
    want = calibration_pairs(plain, "pairwise")
    assert len(want[0]) == len(ITEMS)
    assert calibration_pairs(selective, "pairwise") == want  # the withheld ones are not dropped
    # and so does the threshold's view of them, through a map
    assert given_pairs(selective, "pairwise", SQUEEZE) == given_pairs(plain, "pairwise", SQUEEZE)


def test_a_refit_on_a_calibrated_evaluators_results_is_the_fit_on_the_plain_ones(both):
    plain, selective = both
    fitted = [fit(x, "pairwise", FITTED_ON, method="isotonic", level=None, risk=None)[0] for x in (plain, selective)]
    assert fitted[0] == fitted[1] and fitted[0].map.n == len(ITEMS)


def test_other_abstentions_stay_out_of_the_calibration_pairs():
    line = {"prediction": None, "human": "1", "abstained": "parse_failure", "withheld": None,
            "referees": {"a": [{"score_1": 9, "score_2": 2}]}}
    assert calibration_pairs([line], "pairwise") == ([], [])


# ---------------------------------------------------------------- the review reads a withheld verdict as one


def test_review_ranks_withheld_first_and_does_not_call_them_a_panel_abstention(both):
    _, selective = both
    withheld = {x["id"] for x in selective if x["abstained"] == NEEDS_PERSON}
    ranked = [u for _, u in rank(selective, "pairwise")]
    assert {u.item_id for u in ranked[: len(withheld)]} == withheld
    for line in selective:
        u = uncertainty(line, "pairwise")
        assert u.components["abstained"] == 0.0  # every referee answered: the panel reached a verdict
        assert not any("the panel abstained" in r for r in u.reasons)


def test_the_pointwise_margin_of_a_withheld_verdict_is_its_own():
    given = {"format": "pointwise", "prediction": {"naturalness": 2.5, "coherence": 2.0, "engagingness": 3.0,
                                                   "groundedness": 1}, "abstained": None}
    withheld = {**given, "prediction": None, "withheld": given["prediction"], "abstained": NEEDS_PERSON}
    assert uncertainty(given, "pointwise").components["margin"] > 0
    assert uncertainty(withheld, "pointwise").components["margin"] == uncertainty(given, "pointwise").components["margin"]


def test_the_review_page_shows_a_withheld_verdict_as_the_panels_leaning():
    panel = {"prediction": None, "withheld": "2", "abstained": NEEDS_PERSON, "confidence": 0.41,
             "confidence_calibrated": True}
    said = panel_text(ReviewItem("t", "q1", {}, {}, panel))
    assert "needs a person" in said and "0.41" in said and "leaned: answer 2" in said
    assert "abstained" not in said


def test_a_trace_holds_the_confidence_and_the_withheld_verdict(both):
    from chateval_dspy.run.tracing.spans import debate_tree

    _, selective = both
    line = next(x for x in selective if x["abstained"] == NEEDS_PERSON)
    outputs = debate_tree(line)["outputs"]
    assert outputs["winner"] is None and outputs["abstained"] == NEEDS_PERSON
    assert outputs["withheld"] == line["withheld"] and outputs["confidence"] == line["confidence"]
    assert outputs["confidence_calibrated"] is True


# ---------------------------------------------------------------- 2. the loop: score, review, labels


def saved_evaluator(tmp_path):
    program = build_evaluator(CFG)
    return save_program(program, tmp_path / "prog", make_card(program, model="fake/card-model"))


def items_file(tmp_path, items=ITEMS):
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({k: x[k] for k in ("id", "question", "answer_1", "answer_2")}) + "\n"
                           for x in items), encoding="utf-8")
    return src


@pytest.mark.slow
def test_withheld_verdicts_go_to_a_queue_and_the_answers_come_back_as_labels(
        tracking_server, engine, restore_logging, tmp_path, monkeypatch):
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType
    from mlflow.genai.review_queues import list_review_queue_items, list_review_queues

    from optim.review import sources
    from optim.tuning.labels import LabelledData

    uri, _ = tracking_server
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    saved, src = saved_evaluator(tmp_path), items_file(tmp_path)
    plain = tmp_path / "plain.jsonl"
    code, out, err = chateval_captured("score", str(saved), "--in", str(src), "--out", str(plain), "--no-trace", "--no-progress")
    assert code == 0, out + err
    save_calibration(saved, with_threshold(middle_threshold(plain)))
    judged = tmp_path / "judged.jsonl"
    code, out, err = chateval_captured("score", str(saved), "--in", str(src), "--out", str(judged), "--trace", "--no-progress")
    assert code == 0, out + err
    mlflow.set_tracking_uri(uri)
    mlflow.flush_trace_async_logging()
    withheld = {x["id"] for x in lines(judged) if x["abstained"] == NEEDS_PERSON}
    assert 0 < len(withheld) < len(ITEMS)

    code, out, err = chateval_captured("review", str(judged), "--queue", "needs-people", "--top", str(len(withheld)),
                                       "--reviewer", "ann")
    assert code == 0, out + err
    experiment = mlflow.get_experiment_by_name("chateval-dspy").experiment_id
    (queue,) = [q for q in list_review_queues(experiment_id=experiment) if q.name == "needs-people"]
    item_of = {t.info.trace_id: sources.item_id_of(t) for t in sources.search(experiment, spans=False)}
    queued = [i.item_id for i in list_review_queue_items(queue.queue_id)]
    assert {item_of[t] for t in queued} == withheld  # exactly the items the panel withheld
    by_id = {x["id"]: x for x in lines(judged)}
    for trace_id in queued:  # the review page reads the panel's withheld verdict back from the trace
        back = sources.record_from_trace(mlflow.get_trace(trace_id))
        line = by_id[back["id"]]
        assert back["withheld"] == line["withheld"] and back["confidence"] == pytest.approx(line["confidence"])
        leaned = "a tie" if line["withheld"] == "tie" else f"answer {line['withheld']}"
        assert f"leaned: {leaned}" in panel_text(ReviewItem(trace_id, back["id"], {}, {}, back))

    truth = {str(x.id): x.label for x in ITEMS}
    for trace_id in queued:  # the reviewer answers, as the Review page stores it
        mlflow.log_feedback(trace_id=trace_id, name="preference", value=truth[item_of[trace_id]],
                            source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="ann"))
    mlflow.flush_trace_async_logging()
    data = LabelledData(("mlflow:chateval-dspy",), task="pairwise", tracking_uri=uri)  # what compile --labels reads
    items, _ = data.load()
    assert {str(x.id): x.label for x in items} == {i: truth[i] for i in withheld}
    card = data.label_set().card()
    assert card["from_review"] == len(withheld) and card["reviewers"] == {"ann": len(withheld)}


# ---------------------------------------------------------------- 3. run identity


def test_evaluate_refuses_to_mix_results_before_and_after_a_calibration_or_another_threshold(tmp_path):
    def stopped_after_3(path):  # a run killed after its third item
        path.write_text("".join(json.dumps(x) + "\n" for x in lines(path)[:3]), encoding="utf-8")

    before = tmp_path / "before.jsonl"
    run_eval(ITEMS, build_evaluator(CFG), out=before)
    threshold = middle_threshold(before)
    stopped_after_3(before)
    with pytest.raises(ConfigError, match="another run") as err:
        run_eval(ITEMS, calibrated(with_threshold(threshold)), out=before)
    assert str(before) in str(err.value)
    after = tmp_path / "after.jsonl"
    run_eval(ITEMS, calibrated(with_threshold(threshold)), out=after)
    stopped_after_3(after)
    assert run_eval(ITEMS, calibrated(with_threshold(threshold)), out=after).resumed == 3  # the same run resumes
    stopped_after_3(after)
    with pytest.raises(ConfigError, match="another run"):
        run_eval(ITEMS, calibrated(with_threshold(min(1.0, threshold + 0.05))), out=after)
    with pytest.raises(ConfigError, match="another run"):
        run_eval(ITEMS, calibrated(with_threshold(threshold, SQUEEZE)), out=after)


def test_score_refuses_to_resume_verdicts_written_before_the_calibration(engine, tmp_path):
    saved, out = saved_evaluator(tmp_path), tmp_path / "verdicts.jsonl"
    with load(saved) as judge:
        score_file(judge, items_file(tmp_path, ITEMS[:3]), out)
    save_calibration(saved, with_threshold(middle_threshold(out)))
    with load(saved) as judge, pytest.raises(ConfigError, match="another run"):
        score_file(judge, items_file(tmp_path), out)


# ---------------------------------------------------------------- 4. the summary and the MLflow metrics


def test_the_summary_and_the_mlflow_metrics_state_coverage_and_needs_person(tmp_path):
    plain = tmp_path / "plain.jsonl"
    run_eval(ITEMS, build_evaluator(CFG), out=plain)
    out = tmp_path / "selective.jsonl"
    result = run_eval(ITEMS, calibrated(with_threshold(middle_threshold(plain))), out=out)
    withheld = sum(x["abstained"] == NEEDS_PERSON for x in lines(out))
    metrics, cost = result.metrics(n_resamples=FEW), result.cost()
    logged = metric_values(metrics, {**cost, **result.abstention_metrics()})
    given = len(ITEMS) - withheld
    assert logged["coverage"] == pytest.approx(given / len(ITEMS)) and logged["needs_person_items"] == withheld
    assert logged["coverage_ci_low"] < logged["coverage"] < logged["coverage_ci_high"]
    assert logged[f"abstained_items/{NEEDS_PERSON}"] == withheld and logged["accuracy_n"] == given
    table = summary_table(metrics, cost, {"model": "fake"}, abstentions=result.abstention_counts())
    assert f"{cost['coverage']:.3f} [{cost['coverage_ci_low']:.3f}, {cost['coverage_ci_high']:.3f}]" in table
    assert f"{withheld} withheld as needs_person" in table
    assert f"items with a human label among the items not withheld: {given}" in table
