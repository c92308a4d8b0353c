"""``chateval search --objectives agreement,cascade_cost``: each
trial's panel is the second stage after a saved cheap evaluator judged once on the dev items, and the trial's value
is the cascade's US dollars per 1,000 verdicts at the guaranteed level on those items (in-sample).

The referees are the simulated ones (``chateval_dspy.testing.sim_lm``) with item difficulty, priced at a stated rate
(as in ``test_cascade_build``): a weaker cheap referee first, trial panels of stronger ones.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math

import optuna
import pytest
from chateval_cli import chateval_few_resamples
from optuna.trial import TrialState

import chateval_dspy.lm.resolve
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.pricing import attach_price, stated_price
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.sim_lm import SimKnobs, sim_lm, synthetic_items
from optim.search import study as studies
from optim.search.objective import Objective
from optim.search.space import SearchSpace
from optim.tuning.cascade import declare

ITEMS = synthetic_items(400)
KNOBS = SimKnobs(difficulty_spread=1.0, accuracy=(("scientist", 0.75),), default_accuracy=0.85)
PRICE = "1,2"  # US dollars per million input and output tokens, stated for the simulated model
# Panels of one or two same-role referees, one round, one order: few calls, so that a trial is quick.
SPACE = SearchSpace(panels=("same",), n_roles=(1, 2), turns=(1, 1), strategies=("one_by_one",), aggregates=("mean",))


@contextlib.contextmanager
def models(made: list, *, priced: bool = True):
    """Every model spec resolves to the simulated referees (priced unless ``priced`` is False); LMs made go to
    ``made``."""
    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        lm = sim_lm(KNOBS, ITEMS)
        made.append(attach_price(lm, stated_price(PRICE)) if priced else lm)
        yield made[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
        yield


@pytest.fixture
def workdir(tmp_path, monkeypatch, mlflow_db):
    """A working directory with the labelled items, a saved cheap evaluator (one Scientist, one order) and an MLflow
    store."""
    import shutil

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "sim.jsonl").write_text("".join(
        json.dumps({k: x[k] for k in ("id", "question", "answer_1", "answer_2", "label")}) + "\n" for x in ITEMS),
        encoding="utf-8")
    program = build_evaluator(DebateConfig(roles=("scientist",), turns=1, calibrate=False))
    save_program(program, tmp_path / "programs" / "single", make_card(program, model="sim/referees"))
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    return tmp_path


SEARCH = ("search", "--dataset", "sim.jsonl", "--format", "pairwise", "--same-role", "1", "--turns", "1",
          "--strategy", "one_by_one", "--aggregate", "mean", "--no-calibrate", "--no-progress",
          "--objectives", "agreement,cascade_cost", "--first-stage", "programs/single", "--risk", "0.2")


@pytest.mark.slow  # two trials on 80 dev items, MLflow logging and the final test (about 15 s)
def test_a_trial_is_valued_at_the_cascade_dollars_per_1000_verdicts_and_logged(workdir, capsys):
    import mlflow

    made: list = []
    with models(made):
        assert chateval_few_resamples(*SEARCH, "--limit", "80", "--trials", "2", "--agree-at-least", "0.75", "--study", "c",
                                      "--out", "programs/best", "--no-log-model") == 0
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="c", storage="sqlite:///mlruns/optuna.db")
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    trial = study.trials[0]
    figure = trial.user_attrs["cascade"]
    assert figure["reached"] and figure["in_sample"] and figure["header"]["split"] == "dev (seed 0)"
    first, panel = figure["stages"]
    assert figure["header"]["n"] == 80 and first["reached"] == 80  # the first stage judged every dev item
    assert first["left"] + panel["left"] == round(figure["coverage"]["value"] * 80)
    assert panel["reached"] == 80 - first["left"]  # the panel judged only what the first stage passed on
    # The value is the stages' dollars on the items they judged, over the verdicts given.
    given = first["left"] + panel["left"]
    assert trial.values[1] == pytest.approx(1000 * (first["usd"] + panel["usd"]) / given)
    assert first["usd"] == pytest.approx(first["alone_usd"]) and 0 < panel["usd"] <= panel["alone_usd"]
    # ... and those dollars are the results files': the first stage's, and the trial's own.
    first_file = next((workdir / "results" / "c" / "first-stage").glob("calibration-*.jsonl"))
    assert first["usd"] == pytest.approx(sum(json.loads(line)["cost_usd"] for line in first_file.read_text().splitlines()))
    trial_lines = [json.loads(line) for line in open(trial.user_attrs["results"], encoding="utf-8")]
    assert panel["alone_usd"] == pytest.approx(sum(r["cost_usd"] for r in trial_lines))
    assert "cascade $" in out and "in-sample" in out and "chateval cascade" in out

    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlruns' / 'mlflow.db'}")
    run = mlflow.get_run(trial.user_attrs["mlflow_run_id"])
    assert run.data.metrics["objective.cascade_usd_per_1000"] == pytest.approx(trial.values[1])
    assert run.data.metrics["dev.cascade.reached"] == 1.0 and "cascade.in_sample" in run.data.params
    card = json.loads((workdir / "programs" / "best" / "card.json").read_text())
    assert card["search"]["objectives"] == ["agreement", "cascade_cost"]
    assert card["search"]["cascade"]["level"] == 0.75 and "held-out" in card["search"]["cascade"]["note"]
    # trials.csv carries each trial's cascade dollars beside its agreement
    table = csv.DictReader((workdir / "results" / "c" / "trials.csv").read_text(encoding="utf-8").splitlines())
    assert [float(row["cascade_usd_per_1000"]) for row in table] == pytest.approx([t.values[1] for t in study.trials])


def test_the_first_stage_is_judged_once_and_a_rerun_reads_it_back(workdir, capsys):
    made: list = []
    argv = (*SEARCH, "--limit", "40", "--agree-at-least", "0.75", "--study", "once", "--no-mlflow", "--no-test")
    with models(made):
        assert chateval_few_resamples(*argv, "--trials", "1") == 0
    first_calls = [len(lm.engine.calls) for lm in made]
    assert first_calls[0] == 40  # one referee, one order, 40 dev items: the first stage
    made.clear()
    with models(made):
        assert chateval_few_resamples(*argv, "--trials", "2") == 0
    # The rerun: the first stage's LM answered nothing (its results file was read back).
    assert len(made[0].engine.calls) == 0
    study = optuna.load_study(study_name="once", storage="sqlite:///mlruns/optuna.db")
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 2
    capsys.readouterr()
    # Another level is another search: the study refuses to mix it in.
    with models([]):
        assert chateval_few_resamples(*SEARCH, "--limit", "40", "--agree-at-least", "0.7", "--study", "once",
                                      "--no-mlflow", "--no-test",
                                      "--trials", "3") == 2
    assert "other settings (cascade:" in capsys.readouterr().err


def test_a_level_no_threshold_reaches_counts_as_infinite_and_is_chosen_last(workdir, capsys):
    made: list = []
    with models(made):
        # 10 dev items: the fixed-sequence test needs 30 verdicts above a threshold, so no level is reachable.
        assert chateval_few_resamples(*SEARCH, "--limit", "10", "--trials", "1", "--agree-at-least", "0.75", "--study", "few",
                                      "--out", "programs/few", "--no-mlflow") == 0
    study = optuna.load_study(study_name="few", storage="sqlite:///mlruns/optuna.db")
    (trial,) = study.trials
    assert trial.state == TrialState.COMPLETE and trial.values[1] == math.inf
    assert trial.user_attrs["cascade"]["reached"] is False and trial.user_attrs["cascade"]["usd_per_1000"] is None
    assert "level not reached on dev" in capsys.readouterr().out
    card = json.loads((workdir / "programs" / "few" / "card.json").read_text())
    assert card["search"]["values"][1] is None  # JSON has no infinity


def test_a_reached_trial_is_chosen_before_an_unreached_one_with_better_agreement():
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values in ((0.9, math.inf), (0.7, 3.0), (0.6, 1.0)):
        study.add_trial(optuna.trial.create_trial(values=list(values)))
    assert studies.best_trial(study).values == [0.7, 3.0]
    only = optuna.create_study(directions=["maximize", "minimize"])
    only.add_trial(optuna.trial.create_trial(values=[0.5, math.inf]))
    assert studies.best_trial(only).values == [0.5, math.inf]  # none reached: the best agreement still


def test_cascade_flags_go_together(workdir):
    from optim.cli.main import build_parser
    from optim.cli.search import cascade_from_args
    from optim.search.run import check_cascade
    from optim.search.study_spec import StudySpec

    args = build_parser().parse_args(["search", "--dataset", "faireval", "--trials", "1", "--first-stage", "p"])
    with pytest.raises(ConfigError, match="--first-stage.*together"):
        cascade_from_args(args)
    with pytest.raises(ConfigError, match="needs the cascade's first stage"):
        check_cascade(StudySpec("s", trials=1, objectives=("agreement", "cascade_cost")), None)
    declared = declare(["first=p"], level=0.8, risk=0.1)
    with pytest.raises(ConfigError, match="are for --objectives agreement,cascade_cost"):
        check_cascade(StudySpec("s", trials=1), declared)
    with pytest.raises(ConfigError, match="give both or neither"):
        Objective(space=SPACE, base=DebateConfig(), parts={}, objectives=("agreement", "cascade_cost"))


def test_an_unpriced_first_stage_is_refused_before_any_trial(workdir, capsys):
    made: list = []
    with models(made, priced=False):
        assert chateval_few_resamples(*SEARCH, "--limit", "10", "--trials", "1", "--agree-at-least", "0.75", "--study", "free",
                                      "--no-mlflow") == 2
    assert "carry no US dollars" in capsys.readouterr().err
    assert len(made) == 1  # the first stage's LM only: no trial ran


def test_a_first_stage_of_another_task_is_refused(workdir, capsys):
    program = build_evaluator(DebateConfig(format="pointwise", roles=("scientist",), turns=1))
    save_program(program, workdir / "programs" / "scores", make_card(program, model="sim/referees"))
    with models([]):
        assert chateval_few_resamples(*SEARCH[:-4], "--first-stage", "programs/scores", "--risk", "0.2",
                                      "--limit", "10", "--trials", "1",
                                      "--agree-at-least", "0.75", "--study", "task", "--no-mlflow") == 2
    assert "same task" in capsys.readouterr().err
