"""Human feedback on traced debates becomes training labels, by a stated rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from repo_paths import ROOT
from stored_traces import feedback, traced

from chateval_dspy.data.spec import DataSpec
from chateval_dspy.deploy.mlflow.trace_labels import resolve
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.program.task import load_task
from optim.tuning.labels import LabelledData, labels_from_mlflow, parse_source, read_labels


def test_parse_source_and_rule():
    assert parse_source("mlflow:exp") == ("exp", None)
    with pytest.raises(ConfigError, match="mlflow:<experiment>"):
        parse_source("exp")
    with pytest.raises(ConfigError, match="unknown option"):
        parse_source("mlflow:exp?limit=3")
    assert resolve([1, 2, 2], ordinal=False) == "2" and resolve(["1", "2"], ordinal=False) is None
    assert resolve([3, 5], ordinal=True) == 4.0


@pytest.mark.slow
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
    assert list(got.items) == ["i0"] and got.items["i0"].label == "2"
    assert got.disagreements == 1 and got.unlabelled == 2 and got.labels == 3  # c has no feedback at all
    assert got.trace_ids == {"i0": a} and got.reviewers == {"ann": 2, "bob": 1}
    card = got.card()
    assert card["traces"] == [a] and card["items"] == 1 and card["disagreements"] == 1 and card["from_review"] == 3
    del c


@pytest.mark.slow
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
    (x,) = got.items.values()
    assert x.human["faithful"] == "pass" and abs(x.human["relevance"] - 14 / 3) < 1e-9
    assert got.labels == 6 and got.disagreements == 0


def faireval_ids(n: int) -> list:
    from chateval_dspy.data.loaders import load_dataset

    return load_dataset("faireval")[0][:n]


def write_rows(path: Path, rows: list[dict]) -> str:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_a_label_file_labels_dataset_items_by_id_and_new_items_by_their_inputs(tmp_path):
    base = faireval_ids(3)
    rows = [{"id": base[0].id, "label": "tie", "reviewer": "ann"}, {"id": base[0].id, "label": "tie", "reviewer": "bo"},
            {"id": base[1].id, "label": "1", "reviewer": "ann"}, {"id": base[1].id, "label": "2", "reviewer": "bo"},
            {"id": "new", "question": "2+2?", "answer_1": "4", "answer_2": "5", "label": "1"}]
    got = read_labels([write_rows(tmp_path / "l.jsonl", rows)], "pairwise", base=base)
    assert list(got.items) == [base[0].id, "new"] and got.items[base[0].id].label == "tie"
    assert got.items[base[0].id].question == base[0].question  # the dataset's own texts
    assert got.disagreements == 1 and got.labels == 5 and got.from_review == 0  # base[1]: 1:1, left unlabelled
    assert got.reviewers == {"ann": 2, "bo": 2, "file": 1} and got.card()["from_files"] == 5


def test_a_bad_label_file_names_file_row_and_field(tmp_path):
    base = faireval_ids(1)
    unknown = write_rows(tmp_path / "a.jsonl", [{"id": base[0].id, "label": "1"}, {"id": "zz", "label": "2"}])
    with pytest.raises(DataError, match=r"a.jsonl row 2.*field 'id'.*no item of the dataset"):
        read_labels([unknown], "pairwise", base=base)
    off_scale = write_rows(tmp_path / "b.jsonl", [{"id": base[0].id, "label": "maybe"}])
    with pytest.raises(DataError, match=r"b.jsonl row 1"):
        read_labels([off_scale], "pairwise", base=base)
    with pytest.raises(DataError, match=r"c.jsonl row 1.*no label"):
        read_labels([write_rows(tmp_path / "c.jsonl", [{"id": base[0].id}])], "pairwise", base=base)
    with pytest.raises(ConfigError, match="no such file"):
        read_labels([str(tmp_path / "missing.csv")], "pairwise")


@pytest.mark.slow
def test_mlflow_feedback_overrides_a_label_file_which_overrides_the_dataset(store, tmp_path):
    mlflow = store
    base = faireval_ids(2)
    x = base[0]
    t = traced(mlflow, str(x.id), {"question": x.question, "answer_1": x.answer_1, "answer_2": x.answer_2})
    mlflow.flush_trace_async_logging()
    feedback(mlflow, t, "label", "tie", "ann")
    wrong = {"1": "2", "2": "1", "tie": "1"}
    path = write_rows(tmp_path / "l.jsonl", [{"id": x.id, "label": wrong[x.label]}, {"id": base[1].id, "label": "tie"}])
    got = read_labels(["mlflow:review", path], "pairwise", base=base)  # files are read first, whatever the order
    assert got.items[str(x.id)].label == "tie" and got.items[str(base[1].id)].label == "tie"
    assert got.overridden == 1 and got.trace_ids == {str(x.id): t}
    assert [s["source"] for s in got.card()["sources"]] == [path, "mlflow:review"]


def test_labelled_items_train_and_leave_dev_and_test(tmp_path):
    data = DataSpec("faireval", seed=0)
    items, _ = data.load()
    test_ids = [x.id for x in data.parts(items)["test"][:3]]
    path = write_rows(tmp_path / "l.csv.jsonl", [{"id": i, "label": "tie"} for i in test_ids])
    labelled = LabelledData((path,), data)
    merged, fmt = labelled.load()
    parts = labelled.parts(merged)
    assert fmt == "pairwise" and len(merged) == len(items)
    assert set(test_ids) <= {x.id for x in parts["train"]} and not set(test_ids) & {x.id for x in parts["test"]}
    assert all(x.label == "tie" for x in parts["train"] if x.id in test_ids)
    assert labelled.label_set().overridden == 3 and labelled.dataset == f"faireval+{path}"
    # Without a dataset the labelled items are the data, split by the seed.
    alone = LabelledData((write_rows(tmp_path / "own.jsonl", [
        {"id": f"o{i}", "question": f"q{i}", "answer_1": "a", "answer_2": "b", "label": "1"} for i in range(10)]),))
    own, _ = alone.load()
    assert sorted(len(v) for v in alone.parts(own).values()) == [2, 4, 4]


def test_compile_needs_a_dataset_or_labels():
    from optim.cli.main import main

    assert main(["compile", "--out", "x", "--no-mlflow"]) == 2


@pytest.mark.slow
def test_an_unknown_experiment_is_a_clear_error(store):
    with pytest.raises(ConfigError, match="no MLflow experiment named 'nope'"):
        labels_from_mlflow("mlflow:nope")
    assert os.environ["MLFLOW_TRACKING_URI"].startswith("sqlite:")
