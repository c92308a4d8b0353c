"""``chateval search --objectives agreement,robustness``: each trial's panel is audited on the dev items with the
text probes (verbosity, authority, bandwagon, distraction), and its second value is their mean robustness rate;
logged per trial in MLflow and in ``trials.csv`` (as is the cascade's cost: see ``test_search_cascade``).

The referees are the simulated ones (``chateval_dspy.testing.sim_lm``), right on content, with a planted verbosity
bias or none, on pairs whose answers are exactly as long (``optim.audit.recovery.pairs``): only text a probe adds to
an answer (padding, a citation, a distraction) makes it longer, so a referee without the bias is never moved.
"""

from __future__ import annotations

import contextlib
import json

import optuna
import pandas as pd
import pytest

import chateval_dspy.lm.resolve
from chateval_dspy.errors import ConfigError
from chateval_dspy.testing.sim_lm import SimKnobs, sim_lm
from optim.audit.recovery import known, pairs
from optim.search.space import parse_objectives
from optim.search.study import best_trial

ITEMS = pairs(60, equal_length=True)


@contextlib.contextmanager
def referees(verbosity_bias: float):
    """Every model spec resolves to simulated referees right on content, with ``verbosity_bias`` planted; they know
    every perturbation the audit makes of the items (seed 0)."""
    knobs = SimKnobs(accuracy=(), default_accuracy=1.0, ceiling=1.0, seed=0, verbosity_bias=verbosity_bias)

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield sim_lm(knobs, known(ITEMS, 0))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
        yield


@pytest.fixture
def workdir(tmp_path, monkeypatch, mlflow_db):
    import shutil

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "eq.jsonl").write_text("".join(
        json.dumps({k: x[k] for k in ("id", "question", "answer_1", "answer_2", "label")}) + "\n" for x in ITEMS),
        encoding="utf-8")
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    return tmp_path


SEARCH = ("search", "--dataset", "eq.jsonl", "--format", "pairwise", "--same-role", "1", "--turns", "1",
          "--strategy", "one_by_one", "--aggregate", "mean", "--no-calibrate", "--no-progress", "--limit", "20",
          "--objectives", "agreement,robustness", "--resamples", "20", "--no-log-model")


@pytest.mark.slow  # two searches of one trial on 12 dev items, each audited with four probes, MLflow logging
def test_a_trial_is_valued_at_its_mean_robustness_and_it_is_logged_and_tabled(workdir):
    import mlflow

    from optim.cli.main import main

    for study, bias in (("fair", 0.0), ("padded", 0.6)):
        with referees(bias):
            assert main([*SEARCH, "--trials", "1", "--study", study, "--out", f"programs/{study}"]) == 0
    values = {}
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlruns' / 'mlflow.db'}")
    for study in ("fair", "padded"):
        found = optuna.load_study(study_name=study, storage="sqlite:///mlruns/optuna.db")
        assert [d.name for d in found.directions] == ["MAXIMIZE", "MAXIMIZE"]
        trial = found.trials[0]
        probes = trial.user_attrs["robustness"]["probes"]
        assert sorted(probes) == ["authority", "bandwagon", "distraction", "verbosity"]
        dev = trial.user_attrs["dev"]["accuracy"]["n"]
        assert dev > 0 and all(p["n"] == dev for p in probes.values())  # every dev item, judged before and after
        assert trial.user_attrs["robustness"]["data"] == f"dev split, {dev} items"
        rates = [p["value"] for p in probes.values()]
        assert trial.values[1] == pytest.approx(sum(rates) / 4)
        values[study] = probes
        run = mlflow.get_run(trial.user_attrs["mlflow_run_id"])
        assert run.data.metrics["objective.robustness"] == pytest.approx(trial.values[1])
        assert run.data.metrics["dev.audit.verbosity_robustness_rate"] == pytest.approx(probes["verbosity"]["value"])
        table = pd.read_csv(workdir / "results" / study / "trials.csv")
        assert table["robustness"].tolist() == pytest.approx([trial.values[1]])
        assert "cascade_usd_per_1000" not in table.columns
    # Right on content and unbiased, nothing moves the referee; biased to length, text added to the worse answer
    # moves it, and text added to the question (bandwagon) does not.
    assert {p["value"] for p in values["fair"].values()} == {1.0}
    assert all(values["padded"][p]["ci_high"] < 1.0 for p in ("verbosity", "authority", "distraction"))
    assert values["padded"]["bandwagon"]["value"] == 1.0


def test_robustness_objectives_parse_and_the_best_trial_prefers_the_more_robust_panel():
    assert parse_objectives("agreement,cascade_cost,robustness") == ("agreement", "cascade_cost", "robustness")
    with pytest.raises(ConfigError, match="--objectives must be one of"):
        parse_objectives("robustness,agreement")  # agreement picks the final program: it comes first
    study = optuna.create_study(directions=["maximize", "minimize", "maximize"])
    for values in ([0.8, 2.0, 0.7], [0.8, 2.0, 0.9], [0.8, 3.0, 1.0], [0.7, 1.0, 1.0]):
        study.add_trial(optuna.trial.create_trial(values=values))
    # Same agreement and cost: the more robust wins; a cheaper panel beats a more robust but costlier one.
    assert best_trial(study).number == 1
    two = optuna.create_study(directions=["maximize", "maximize"])
    for values in ([0.8, 0.7], [0.8, 0.9], [0.6, 1.0]):
        two.add_trial(optuna.trial.create_trial(values=values))
    assert best_trial(two).number == 1


def test_trials_csv_columns_follow_the_objectives():
    from optim.search.run import objective_columns

    study = optuna.create_study(directions=["maximize", "minimize", "maximize"])
    study.add_trial(optuna.trial.create_trial(values=[0.8, float("inf"), 0.9]))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED))
    columns = objective_columns(study, ("agreement", "cascade_cost", "robustness"))
    assert list(columns) == ["cascade_usd_per_1000", "robustness"]
    assert columns["cascade_usd_per_1000"][0] == float("inf") and columns["robustness"][0] == 0.9
    assert all(v != v for v in (columns["cascade_usd_per_1000"][1], columns["robustness"][1]))  # NaN: no value
