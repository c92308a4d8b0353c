"""``chateval report``: a study's table and PNG plots, a run's metrics and confusion matrix or scatter, clear errors."""

from __future__ import annotations

import re

import optuna
import pytest

# The fake-LM working directory and the ready-made MLflow store are shared with the search tests.
from chateval_cli import chateval_few_resamples


def test_report_for_a_two_objective_study_writes_its_plots(workdir, tmp_path, capsys):
    assert chateval_few_resamples("search", "--dataset", "faireval", "--limit", "4", "--trials", "6", "--turns", "1", "--no-test",
                                  "--no-progress", "--objectives", "agreement,tokens", "--study", "pareto") == 0
    capsys.readouterr()
    assert chateval_few_resamples("report", "pareto", "--out", "reports/p") == 0
    out = capsys.readouterr().out
    names = {p.name for p in (tmp_path / "reports" / "p").iterdir()}
    assert {"agreement_vs_roles_turns.png", "optimization_history.png", "param_importances.png",
            "pareto_front.png"} <= names
    assert all((tmp_path / "reports" / "p" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    assert "study pareto: 6 trials" in out and "tokens_per_item" in out and "Pareto front" in out
    assert "logged the plots to MLflow run" in out  # the study's parent run

    study = optuna.load_study(study_name="pareto", storage="sqlite:///mlruns/optuna.db")
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    run_id = study.user_attrs["mlflow_runs"][f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"]
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "report")}
    assert "report/pareto_front.png" in logged


def test_report_with_one_trial_explains_the_missing_importances(workdir, tmp_path, capsys):
    assert chateval_few_resamples("search", "--dataset", "faireval", "--limit", "2", "--trials", "1", "--turns", "1", "--no-test",
                                  "--no-mlflow", "--no-progress", "--study", "tiny") == 0
    assert chateval_few_resamples("report", "tiny", "--no-mlflow") == 0
    out = capsys.readouterr().out
    assert "parameter importances need at least 2 complete trials; the study has 1" in out
    written = {p.name for p in (tmp_path / "reports" / "tiny").iterdir()}
    assert "param_importances.png" not in written and "agreement_vs_roles_turns.png" in written


@pytest.mark.slow
def test_report_for_evaluate_runs_draws_a_confusion_matrix_and_a_scatter(workdir, tmp_path, capsys):
    import mlflow

    ids = {}
    for dataset in ("faireval", "topical_chat"):
        assert chateval_few_resamples("evaluate", "--dataset", dataset, "--limit", "4", "--turns", "1", "--no-progress",
                                      "--out", f"{dataset}.jsonl") == 0
        ids[dataset] = re.search(r"mlflow run: ([0-9a-f]{32})", capsys.readouterr().out).group(1)
    assert chateval_few_resamples("report", ids["faireval"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"accuracy\s+\d\.\d{3}\s+\[\d\.\d{3}, \d\.\d{3}\]", out) and "dataset=faireval" in out
    assert (tmp_path / "reports" / ids["faireval"] / "confusion_faireval.png").exists()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    assert "report/confusion_faireval.png" in {
        a.path for a in mlflow.MlflowClient().list_artifacts(ids["faireval"], "report")}

    assert chateval_few_resamples("report", ids["topical_chat"], "--out", "reports/tc", "--no-mlflow") == 0
    assert (tmp_path / "reports" / "tc" / "scatter_topical_chat.png").exists()
    out = capsys.readouterr().out
    assert "dataset=topical_chat" in out and "calls_per_item" in out and "Downloading" not in out


def test_unknown_targets_are_clear_errors(workdir, capsys):
    assert chateval_few_resamples("report", "no-such-study") == 2
    err = capsys.readouterr().err
    assert "no study named 'no-such-study'" in err and "32 hex characters" in err
    assert chateval_few_resamples("report", "0" * 32) == 2
    assert "no study or MLflow run '" + "0" * 32 + "'" in capsys.readouterr().err
