"""``chateval calibrate``: a saved evaluator's confidence fitted on a split tuning never saw, the
threshold for a guaranteed agreement level, the check half's report, and the review queue's order by confidence.

The referees are the simulated ones (``chateval_dspy.testing.sim_lm``) with item difficulty, so a panel that agrees
is more often right and the confidence carries real signal; they run behind DSPy's real adapter.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import chateval_dspy.lm.resolve
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import Judge
from chateval_dspy.deploy.saved.store import CALIBRATION_FILE, save_program
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.confidence import Calibration
from chateval_dspy.program.roles import DEFAULT_ORDER
from chateval_dspy.testing.sim_lm import SimKnobs, sim_lm, synthetic_items
from optim.review.uncertainty import rank
from optim.tuning.calibrate import calibrate_judge, halves

ITEMS = synthetic_items(300)  # the test split: 120 items, 60 per half
KNOBS = SimKnobs(difficulty_spread=1.0)


@pytest.fixture
def saved(tmp_path):
    """A saved evaluator (five simulated referees, one round, both orders) and a labelled file of its items."""
    data = tmp_path / "sim.jsonl"
    data.write_text("".join(json.dumps({k: x[k] for k in ("id", "question", "answer_1", "answer_2", "label")}) + "\n"
                            for x in ITEMS), encoding="utf-8")
    program = build_evaluator(DebateConfig(roles=tuple(DEFAULT_ORDER), turns=1))
    save_program(program, tmp_path / "program", make_card(program, model="sim/referees"))
    return tmp_path / "program", data


def judge_of(program_dir, lm=None):
    from chateval_dspy.deploy.saved.store import load_program

    program, card = load_program(program_dir)
    return Judge(program, card, lm or sim_lm(KNOBS, ITEMS), contextlib.ExitStack())


def test_halves_are_seeded_disjoint_and_cover_the_items():
    parts = halves(ITEMS[:9], seed=3)
    ids = [x.id for x in parts["calibration"]] + [x.id for x in parts["check"]]
    assert sorted(ids) == sorted(x.id for x in ITEMS[:9]) and len(parts["calibration"]) == 5
    assert [x.id for x in halves(list(reversed(ITEMS[:9])), seed=3)["check"]] == \
        [x.id for x in reversed(parts["check"])]  # which half depends on the ids, not the file's order
    assert {x.id for x in halves(ITEMS[:9], seed=4)["check"]} != {x.id for x in parts["check"]}


def test_calibrate_fits_and_saves_the_map_on_the_calibration_half(saved, tmp_path):
    program_dir, data = saved
    report = calibrate_judge(judge_of(program_dir), program_dir, DataSpec(str(data), format="pairwise"),
                             out_dir=tmp_path / "out")
    stored = Calibration.from_dict(json.loads((program_dir / CALIBRATION_FILE).read_text()), "calibration.json")
    assert stored.map == report.calibration.map and stored.threshold is None
    assert stored.fitted_on["n"] == 60 and stored.fitted_on["model"] == "sim/referees"
    assert "calibration half" in stored.fitted_on["split"] and stored.fitted_on["seed"] == 0
    assert report.n == {"calibration": 60, "check": 60}
    # Confidence carries signal here: the fitted map rises, so a surer panel is more often right.
    assert stored.map.calibrated[-1] > stored.map.calibrated[0]
    assert report.ece_raw.n == 60 and report.ece_calibrated.n == 60 and report.coverage is None
    assert all(p.is_file() for p in report.diagrams) and len(report.diagrams) == 2
    text = "\n".join(report.lines())
    assert "sim/referees" in text and "test (seed 0)" in text and "n=60" in text and "95%" in text


def test_a_reachable_level_yields_a_threshold_and_the_check_halfs_report(saved, tmp_path):
    program_dir, data = saved
    report = calibrate_judge(judge_of(program_dir), program_dir, DataSpec(str(data), format="pairwise"),
                             out_dir=tmp_path / "out", level=0.8, risk=0.2)
    assert report.reached and report.selection.threshold > min(report.calibration.map.calibrated)
    stored = Calibration.from_dict(json.loads((program_dir / CALIBRATION_FILE).read_text()), "calibration.json")
    assert (stored.threshold, stored.level, stored.risk) == (report.selection.threshold, 0.8, 0.2)
    # A real threshold: some verdicts of the check half are withheld, and those given agree more often than all do.
    assert report.coverage.n == 60 and 0 < report.coverage.value < 1
    assert report.agreement.n == round(report.coverage.value * 60)
    assert report.coverage.low <= report.coverage.value <= report.coverage.high
    assert report.agreement.value > report.selection.agreement.value - 0.2
    assert any("reached" in line and "coverage" in line for line in report.lines())


def test_an_unreachable_level_is_reported_not_silently_lowered(saved, tmp_path, monkeypatch, capsys):
    program_dir, data = saved
    monkeypatch.chdir(tmp_path)
    with sim_resolved(monkeypatch):
        code = main_quiet(["calibrate", "--program", str(program_dir), "--dataset", str(data), "--agree-at-least",
                           "0.99", "--risk", "0.1", "--out-dir", str(tmp_path / "out"), "--no-mlflow",
                           "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    said = next(line for line in out.splitlines() if "NOT REACHED" in line)
    assert said.startswith("level 0.99 at risk 0.1: NOT REACHED on 60 calibration verdicts")
    best = float(said.split("reachable at this risk with these items is ")[1].split("%")[0]) / 100
    assert 0.5 < best < 0.99 and "No threshold saved" in said
    stored = json.loads((program_dir / CALIBRATION_FILE).read_text())
    assert stored["threshold"] is None and stored["level"] is None  # the map is kept, no lowered level is saved
    assert not any(line.startswith("check half") and "coverage" in line for line in out.splitlines())


def test_a_rerun_resumes_the_results_file_and_judges_nothing_twice(saved, tmp_path):
    program_dir, data = saved
    spec = DataSpec(str(data), format="pairwise")
    first = calibrate_judge(judge_of(program_dir), program_dir, spec, out_dir=tmp_path / "out", level=0.8, risk=0.2)
    lm = sim_lm(KNOBS, ITEMS)
    again = calibrate_judge(judge_of(program_dir, lm), program_dir, spec, out_dir=tmp_path / "out", level=0.8,
                            risk=0.2)
    assert first.resumed == 0 and again.resumed == 120 and not lm.engine.calls
    assert again.calibration == first.calibration and again.results == first.results
    assert len(first.results.read_text().splitlines()) == 120


def test_level_and_risk_come_together(saved, tmp_path):
    program_dir, data = saved
    with pytest.raises(ConfigError, match="together"):
        calibrate_judge(judge_of(program_dir), program_dir, DataSpec(str(data), format="pairwise"),
                        out_dir=tmp_path / "out", level=0.8)


def test_review_puts_withheld_items_first_then_the_lowest_confidence():
    lines = [{"id": "sure", "format": "pairwise", "prediction": "1", "confidence": 0.95, "confidence_calibrated": True},
             {"id": "unsure", "format": "pairwise", "prediction": "1", "confidence": 0.55,
              "confidence_calibrated": True},
             {"id": "withheld", "format": "pairwise", "prediction": None, "confidence": 0.7, "withheld": "1",
              "abstained": "needs_person", "confidence_calibrated": True},
             {"id": "old", "format": "pairwise", "prediction": "2", "consistent": False},
             {"id": "raw", "format": "pairwise", "prediction": "2", "confidence": 0.1, "confidence_calibrated": False}]
    ranked = [u for _, u in rank(lines)]
    # A raw confidence is no probability: that line ranks by U (0 here, below the inconsistent line's 0.25).
    assert [u.item_id for u in ranked] == ["withheld", "unsure", "sure", "old", "raw"]
    assert ranked[0].withheld and "needs a person" in ranked[0].explain()
    assert "confidence=0.550 (calibrated)" in ranked[1].explain()
    # Lines without a confidence keep the old score U, most uncertain first.
    assert [u.item_id for _, u in rank([lines[3], {"id": "calm", "format": "pairwise"}])] == ["old", "calm"]


@contextlib.contextmanager
def sim_resolved(monkeypatch):
    """Every model spec the command names resolves to the simulated referees."""
    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield sim_lm(KNOBS, ITEMS)

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    yield


def main_quiet(argv: list[str]) -> int:
    from optim.cli.main import main

    with contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


def test_the_command_logs_its_figures_and_files_to_mlflow(saved, tmp_path, monkeypatch, capsys,
                                                          mlflow_db):
    import shutil

    from mlflow import MlflowClient

    program_dir, data = saved
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    with sim_resolved(monkeypatch):
        code = main_quiet(["calibrate", "--program", str(program_dir), "--dataset", str(data), "--agree-at-least",
                           "0.8", "--risk", "0.2", "--tracking-uri", uri, "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    run_id = next(line.split(": ")[1] for line in out.splitlines() if line.startswith("mlflow run: "))
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.params["level"] == "0.8" and run.data.params["model"] == "sim/referees"
    assert run.data.params["n_calibration"] == "60" and run.data.tags["chateval.command"] == "calibrate"
    metrics = run.data.metrics
    assert metrics["coverage_check_n"] == 60 and metrics["coverage_check_ci_low"] <= metrics["coverage_check"]
    assert {"ece_raw_check", "ece_calibrated_check", "agreement_check"} <= set(metrics)
    logged = {a.path for a in client.list_artifacts(run_id, "calibration")}
    assert {"calibration/calibration.json", "calibration/reliability-calibrated.png"} <= logged


def test_pointwise_verdicts_are_calibrated_per_criterion_and_given_whole(tmp_path):
    """Topical-Chat on the scripted fake LM: one labelled verdict per criterion; a threshold is held against the
    item's least confident criterion, as the runtime gives a pointwise verdict whole or not at all."""
    from chateval_dspy.program.confidence import ConfidenceMap
    from chateval_dspy.testing.fake_lm import fake_lm
    from optim.tuning.calibrate import given_pairs

    program = build_evaluator(DebateConfig(format="pointwise", roles=("critic", "scientist"), turns=1))
    save_program(program, tmp_path / "program", make_card(program, model="fake/scripted"))
    report = calibrate_judge(judge_of(tmp_path / "program", fake_lm()), tmp_path / "program",
                             DataSpec("topical_chat", limit=6), out_dir=tmp_path / "out")
    criteria = len(program.config.task_spec.output_fields)
    assert report.header["items"] == {"calibration": 3, "check": 3}
    assert report.n == {"calibration": 3 * criteria, "check": 3 * criteria}
    assert report.calibration.fitted_on["n"] == 3 * criteria and report.ece_calibrated.n == 3 * criteria
    line = {"prediction": {"a": 3, "b": 2}, "human": {"a": 3, "b": 5},
            "referees": {"x": [{"a": 3, "b": 2}], "y": [{"a": 3, "b": 5}]}}
    task = {"name": "two", "format": "pointwise", "inputs": [{"name": "text", "judged": True}],
            "criteria": [{"name": "a", "description": "a", "scale": "1-5"}, {"name": "b", "description": "b",
                                                                            "scale": "1-5"}]}
    from chateval_dspy.program.task import TaskSpec

    confidence, agreed = given_pairs([line], TaskSpec.from_dict(task), ConfidenceMap(raw=(0.0, 1.0),
                                                                                     calibrated=(0.0, 1.0)))
    assert agreed == [True, False] and confidence[0] == confidence[1] < 1.0  # both held at the weaker criterion's


def test_calibrate_and_cascade_read_their_items_as_evaluate_does_a_merging_label_map_included():
    from optim.cli import flags
    from optim.cli.main import build_parser

    for command in (["calibrate", "--program", "p"], ["cascade", "--out", "o"]):
        given = [*command, "--dataset", "f.jsonl", "--label-map", "0=tie,1=tie", "--limit", "9"]
        plain = flags.held_out_spec(build_parser().parse_args(given))
        merged = flags.held_out_spec(build_parser().parse_args([*given, "--label-map-merge"]))
        assert (plain.label_map_merge, merged.label_map_merge) == (False, True)
        assert merged.label_map == {"0": "tie", "1": "tie"} and merged.limit == 9 and merged.dataset == "f.jsonl"
