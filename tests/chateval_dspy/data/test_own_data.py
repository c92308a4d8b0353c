"""Your own data, no silent gaps: label columns checked as strictly as inputs, label values mapped,
summary- and system-level correlations beside the pooled ones, and error hints that fit the error."""

from __future__ import annotations

import contextlib
import json
import math
import random

import numpy as np
import pytest
import yaml
from data_files import write_jsonl
from scipy import stats

import chateval_dspy.lm.resolve
from chateval_dspy.data.loaders import load_custom, parse_columns, parse_label_map
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.program.task import TaskSpec, load_task
from chateval_dspy.run import metrics
from chateval_dspy.run.table import coverage_notes
from chateval_dspy.testing.fake_lm import fake_lm
from optim.cli.main import main
from optim.tracking.runs import metric_values

SUMMEVAL = {
    "name": "summeval", "format": "pointwise",
    "inputs": [{"name": "document"}, {"name": "summary", "judged": True}],
    "criteria": [{"name": "coherence", "description": "is it well organised?", "scale": "1-5"},
                 {"name": "fluency", "description": "is each sentence well formed?", "scale": "1-5"}],
}
PANDALM = {
    "name": "pandalm", "format": "pairwise",
    "inputs": [{"name": "instruction"}, {"name": "input", "default": "(none)"},
               {"name": "response1", "judged": True}, {"name": "response2", "judged": True}],
    "criteria": [{"name": "quality", "description": "how well {response} follows the instruction", "scale": "1-5"}],
}


@pytest.fixture
def fake_model(monkeypatch):
    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield fake_lm()

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)


@pytest.fixture(autouse=True)
def _restore_logging(restore_logging):
    """main() sets logging up for a terminal (``conftest.restore_logging`` undoes it)."""


def cli(capsys, *argv):
    code = main([*argv, "--no-mlflow", "--no-progress", "--no-cache", "--resamples", "200"])
    out, err = capsys.readouterr()
    return code, out, err


def write_task(tmp_path, spec: dict, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return str(path)


def summeval_rows(n_docs: int = 5, n_systems: int = 4) -> list[dict]:
    """SummEval-shaped: every document summarised by every system, human scores that are not the fake judge's."""
    rng, rows = random.Random(23), []
    for d in range(n_docs):
        for s in range(n_systems):
            length = 5 + 10 * rng.randrange(5) + 2 * s  # the fake judge scores by length (1 point per 10 characters)
            rows.append({"id": f"d{d}-m{s}", "doc": f"doc{d}", "model": f"M{s}", "text": f"article {d}",
                         "summ": "s" * length,
                         "scores": {"coherence": rng.randint(1, 5), "fluency": min(5, s + rng.randint(1, 2))}})
    return rows


# ---- 1: label columns as strict as input columns -----------------------------------------------------------


def test_a_misspelled_label_column_is_an_error_naming_it_and_the_files_columns(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", [{"question": "q", "answer_1": "a", "answer_2": "b", "label": "1"}]))
    with pytest.raises(DataError, match=r"label column\(s\) 'lable' \(label\) in no row") as err:
        load_custom(path, "pairwise", parse_columns("label=lable"))
    assert "the file's columns: 'question', 'answer_1', 'answer_2', 'label'" in str(err.value)
    assert "--skip-bad-rows" not in str(err.value)


def test_a_criterion_mapped_to_a_missing_nested_column_is_an_error(tmp_path):
    task = TaskSpec.from_dict(SUMMEVAL)
    path = str(write_jsonl(tmp_path / "s.jsonl", summeval_rows(1, 3)))
    with pytest.raises(DataError, match=r"'scores.fluncy' \(fluency\) in no row"):
        load_custom(path, task, {"document": "text", "summary": "summ", "coherence": "scores.coherence",
                                 "fluency": "scores.fluncy"})


def test_a_file_rating_some_criteria_names_the_others_unlabelled(tmp_path, capsys, fake_model):
    rows = summeval_rows(1, 3)
    for row in rows:
        del row["scores"]["fluency"]
    path = str(write_jsonl(tmp_path / "s.jsonl", rows))
    argv = ("evaluate", "--dataset", path, "--task", write_task(tmp_path, SUMMEVAL, "se"), "--columns",
            "document=text,summary=summ,coherence=scores.coherence", "--no-mlflow", "--no-progress")
    code, _, err = cli(capsys, *argv, "--out", str(tmp_path / "a.jsonl"))
    assert code == 2 and "'fluency' (fluency) in no row" in err and "--unlabelled fluency" in err
    code, out, err = cli(capsys, *argv, "--unlabelled", "fluency", "--out", str(tmp_path / "b.jsonl"))
    assert code == 0, err
    assert "fluency 3" in out  # every item counted without a fluency label


def test_labels_missing_on_some_rows_are_counted_per_criterion(tmp_path, capsys, fake_model):
    rows = summeval_rows(2, 3)
    del rows[0]["scores"]["fluency"]
    del rows[1]["scores"]  # no label at all: counted missing for every criterion, not silently dropped
    path = str(write_jsonl(tmp_path / "s.jsonl", rows))
    code, out, err = cli(capsys, "evaluate", "--dataset", path, "--task", write_task(tmp_path, SUMMEVAL, "se"),
                         "--columns", "document=text,summary=summ,coherence=scores.coherence,fluency=scores.fluency",
                         "--out", str(tmp_path / "r.jsonl"), "--turns", "1", "--roles", "1")
    assert code == 0, err
    assert "human labels missing (items left out of that criterion): coherence 1, fluency 2" in out
    assert "calibrate=" not in out  # pointwise: nothing to calibrate


def test_missing_counts_reach_mlflow_metrics():
    report = metrics.pointwise_report([{"q": 1}, {"q": 2}, {"q": None}, {"q": 3}], [{"q": 1}, {"q": 2}, {"q": 3},
                                                                                 {"q": 3}],
                                      task=TaskSpec.from_dict({**SUMMEVAL, "criteria": [
                                          {"name": "q", "description": "d", "scale": "1-5"}]}), unlabelled=2)
    assert report["q_missing"] == 3 and metric_values(report)["q_missing"] == 3.0


# ---- 2: label values map ------------------------------------------------------------------------------------


def pandalm_rows() -> list[dict]:
    return [{"idx": i, "instruction": f"do thing {i}", "response1": "r" * (5 + 10 * (i % 3)),
             "response2": "r" * (5 + 10 * ((i + 1) % 3)), "annotator1": [0, 1, 2][i % 3]} for i in range(9)]


def test_pandalm_ties_are_refused_without_a_map_and_judged_with_one(tmp_path, capsys, fake_model):
    path = str(write_jsonl(tmp_path / "pandalm.jsonl", pandalm_rows()))
    task = write_task(tmp_path, PANDALM, "pandalm")
    base = ["evaluate", "--dataset", path, "--task", task, "--columns", "id=idx,label=annotator1",
            "--turns", "1", "--roles", "1"]
    code, _, err = cli(capsys, *base, "--out", str(tmp_path / "a.jsonl"))
    assert code == 2 and "got 0" in err and "--label-map" in err
    code, out, err = cli(capsys, *base, "--label-map", "0=tie", "--out", str(tmp_path / "b.jsonl"))
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["human"] for r in records[:3]] == ["tie", "1", "2"]
    assert "accuracy" in out and "items with a human label: 9" in out


def test_a_task_spec_label_map_is_read_and_kept_out_of_other_specs(tmp_path):
    spec = TaskSpec.from_dict({**PANDALM, "label_map": {0: "tie"}})
    assert spec.label_map == (("0", "tie"),) and TaskSpec.from_dict(spec.to_dict()) == spec
    assert "label_map" not in load_task("faireval").to_dict()  # other specs' dicts (and digests) are unchanged
    items = load_custom(str(write_jsonl(tmp_path / "p.jsonl", pandalm_rows())), spec,
                        {"id": "idx", "label": "annotator1"})
    assert [x.label for x in items[:3]] == ["tie", "1", "2"]
    # the flag's map goes over the spec's (0=2 in a file that holds 2 too: a merge, stated)
    items = load_custom(str(write_jsonl(tmp_path / "p.jsonl", pandalm_rows())), spec,
                        {"id": "idx", "label": "annotator1"}, label_map={"0": "2"}, label_map_merge=True)
    assert items[0].label == "2"
    with pytest.raises(ConfigError, match="label_map"):
        TaskSpec.from_dict({**PANDALM, "label_map": ["0", "tie"]})


def test_parse_label_map_refuses_a_malformed_entry():
    assert parse_label_map("0=tie,A=1") == {"0": "tie", "A": "1"}
    with pytest.raises(DataError, match="--label-map entry 'tie'"):
        parse_label_map("tie")


# ---- 3: summary- and system-level correlations --------------------------------------------------------------


def direct_levels(records, criterion: str) -> dict:
    """Summary-level: correlation within each document, averaged; system-level: of the per-system means."""
    out = {}
    for name, fn in (("spearman", stats.spearmanr), ("kendall", stats.kendalltau)):
        per_doc = []
        for doc in sorted({r["group_id"] for r in records}):
            h = [r["human"][criterion] for r in records if r["group_id"] == doc]
            p = [r["prediction"][criterion] for r in records if r["group_id"] == doc]
            if len(set(h)) > 1 and len(set(p)) > 1:
                per_doc.append(fn(h, p).statistic)
        out[f"{name}_summary"], out["docs"] = float(np.mean(per_doc)), len(per_doc)
        systems = sorted({r["system_id"] for r in records})
        h = [np.mean([r["human"][criterion] for r in records if r["system_id"] == s]) for s in systems]
        p = [np.mean([r["prediction"][criterion] for r in records if r["system_id"] == s]) for s in systems]
        out[f"{name}_system"] = float(fn(h, p).statistic)
    return out


def test_summeval_summary_and_system_level_match_scipy(tmp_path, capsys, fake_model):
    path = str(write_jsonl(tmp_path / "summeval.jsonl", summeval_rows()))
    code, out, err = cli(capsys, "evaluate", "--dataset", path, "--task", write_task(tmp_path, SUMMEVAL, "se"),
                         "--columns", "document=text,summary=summ,coherence=scores.coherence,fluency=scores.fluency",
                         "--group-by", "doc", "--system", "model", "--out", str(tmp_path / "r.jsonl"),
                         "--turns", "1", "--roles", "1")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert {r["group_id"] for r in records} == {f"doc{d}" for d in range(5)}
    run = DataSpec(path, task=write_task(tmp_path, SUMMEVAL, "se"), group_by="doc", system="model",
                   columns={"document": "text", "summary": "summ", "coherence": "scores.coherence",
                            "fluency": "scores.fluency"})
    assert all("group_id" not in x.inputs() for x in run.items()[0])  # never shown to the referees
    report = metrics.pointwise_report([r["human"] for r in records], [r["prediction"] for r in records],
                                      task=TaskSpec.from_dict(SUMMEVAL), groups=[r["group_id"] for r in records],
                                      systems=[r["system_id"] for r in records], n_resamples=200)
    for criterion in ("coherence", "fluency"):
        expected = direct_levels(records, criterion)
        for key in ("spearman_summary", "kendall_summary", "spearman_system", "kendall_system"):
            assert report[f"{criterion}_{key}"].value == pytest.approx(expected[key]), (criterion, key)
        assert report[f"{criterion}_spearman_summary"].n == expected["docs"]
    assert report["n_groups"] == 5 and report["n_systems"] == 4
    assert report["average_spearman_system"].value == pytest.approx(
        np.mean([report[f"{c}_spearman_system"].value for c in ("coherence", "fluency")]))
    assert "coherence_spearman_summary" in out and "fluency_kendall_system" in out
    assert "summary-level (_summary): correlation within each of 5 documents" in out


def test_group_by_on_a_pairwise_task_or_a_builtin_is_refused(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", [{"question": "q", "answer_1": "a", "answer_2": "b", "doc": "x"}]))
    with pytest.raises(DataError, match="pointwise"):
        load_custom(path, "pairwise", group_by="doc")
    with pytest.raises(DataError, match="a file of your own"):
        DataSpec("faireval", group_by="doc").items()


def test_averages_say_over_how_many_criteria():
    notes = coverage_notes({"a_spearman": metrics.Estimate(math.nan, math.nan, math.nan, 3),
                            "b_spearman": metrics.Estimate(0.5, 0, 1, 3), "average_spearman_criteria": 1})
    assert notes == ["average_spearman: over 1 of 2 criteria (the others undefined: a constant column, or no labels)"]


# ---- 4: hints that fit the error ----------------------------------------------------------------------------


def test_a_column_in_no_row_names_the_files_columns_even_when_skipping(tmp_path, caplog):
    path = tmp_path / "t.csv"
    path.write_text("question,answer_1,answer2\n" + "q,a,b\n" * 50, encoding="utf-8")
    for skip in (False, True):
        with pytest.raises(DataError) as err:
            load_custom(path, "pairwise", skip_bad_rows=skip)
        text = str(err.value)
        assert "column 'answer_2' (input 'answer_2') is in no row" in text
        assert "the file's columns: 'question', 'answer_1', 'answer2'" in text and "--skip-bad-rows" not in text
    assert "skipping" not in caplog.text  # no warning per row before the error


def test_a_row_error_still_names_skip_bad_rows(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("question,answer_1,answer_2\nq,a,b\n,a,b\n", encoding="utf-8")
    with pytest.raises(DataError, match="--skip-bad-rows"):
        load_custom(path, "pairwise")


def test_a_skipped_row_is_reported_once(tmp_path, capsys, fake_model):
    path = tmp_path / "p.csv"
    path.write_text("question,answer_1,answer_2,label\nq,aaaa,b,1\n,a,b,2\nq2,a,bbbbbbbbbbbb,2\n", encoding="utf-8")
    code, out, err = cli(capsys, "evaluate", "--dataset", str(path), "--format", "pairwise", "--skip-bad-rows",
                         "--out", str(tmp_path / "r.jsonl"), "--turns", "1", "--roles", "1")
    assert code == 0, err
    assert (out + err).count("row 3: field 'question': field is empty") == 1, out + err
