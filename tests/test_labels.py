"""Issue 13 (item 3): human feedback on traced debates becomes training labels, by a stated rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.task import load_task
from optim.labels import combine, labels_from_mlflow, parse_source, resolve

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("review")
    yield mlflow
    mlflow.flush_trace_async_logging()


def traced(mlflow, item_id: str, inputs: dict) -> str:
    with mlflow.start_span("chateval", span_type="EVALUATOR") as span:
        span.set_inputs({"id": item_id, **inputs})
        span.set_outputs({"winner": "1"})
    client = mlflow.MlflowClient()
    client.set_trace_tag(span.trace_id, "chateval.item_id", item_id)
    return span.trace_id


def feedback(mlflow, trace_id: str, name: str, value, who: str) -> None:
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    mlflow.log_feedback(trace_id=trace_id, name=name, value=value,
                        source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=who))


def test_parse_source_and_rule():
    assert parse_source("mlflow:exp") == ("exp", None)
    with pytest.raises(ConfigError, match="mlflow:<experiment>"):
        parse_source("exp")
    with pytest.raises(ConfigError, match="unknown option"):
        parse_source("mlflow:exp?limit=3")
    assert resolve([1, 2, 2], ordinal=False) == "2" and resolve(["1", "2"], ordinal=False) is None
    assert resolve([3, 5], ordinal=True) == 4.0


def test_pairwise_feedback_becomes_labels_and_disagreements_are_counted(store):
    mlflow = store
    item = {"question": "2+2?", "answer_1": "4", "answer_2": "5"}
    a, b, c = (traced(mlflow, f"i{i}", item) for i in range(3))
    mlflow.flush_trace_async_logging()
    feedback(mlflow, a, "label", "1", "ann")
    feedback(mlflow, a, "label", "2", "ann")  # ann changed her mind: her latest answer counts
    feedback(mlflow, b, "preference", "1", "ann")
    feedback(mlflow, b, "preference", "2", "bob")  # an even split: a disagreement, left unlabelled
    got = labels_from_mlflow("mlflow:review")
    assert [x.id for x in got.items] == ["i0"] and got.items[0].label == "2"
    assert got.disagreements == 1 and got.unlabelled == 2 and got.labels == 3  # c has no feedback at all
    assert got.trace_ids == [a] and got.reviewers["ann"] >= 1
    card = got.card("mlflow:review")
    assert card["traces"] == [a] and card["items"] == 1 and card["disagreements"] == 1
    del c


def test_pointwise_feedback_per_criterion_with_means_and_majorities(store):
    mlflow = store
    task = load_task(str(ROOT / "data" / "examples" / "rag.yaml"))
    item = {"question": "Q?", "context": "C.", "answer": "A."}
    t = traced(mlflow, "r1", item)
    mlflow.flush_trace_async_logging()
    for who, faithful, relevance in (("ann", "pass", 4), ("bob", "pass", 5), ("cy", "fail", 5)):
        feedback(mlflow, t, "faithful", faithful, who)
        feedback(mlflow, t, "relevance", relevance, who)
    got = labels_from_mlflow("mlflow:review", task)
    (x,) = got.items
    assert x.human["faithful"] == "pass" and abs(x.human["relevance"] - 14 / 3) < 1e-9
    assert got.labels == 6 and got.disagreements == 0


def test_reviewers_override_file_labels_for_the_same_item():
    import dspy

    file_items = [dspy.Example(id="a", label="1"), dspy.Example(id="b", label="2")]
    reviewed = [dspy.Example(id="b", label="tie"), dspy.Example(id="c", label="1")]
    merged, overridden = combine(file_items, reviewed)
    assert [(x.id, x.label) for x in merged] == [("a", "1"), ("b", "tie"), ("c", "1")] and overridden == 1


def test_an_unknown_experiment_is_a_clear_error(store):
    with pytest.raises(ConfigError, match="no MLflow experiment named 'nope'"):
        labels_from_mlflow("mlflow:nope")
    assert os.environ["MLFLOW_TRACKING_URI"].startswith("sqlite:")
