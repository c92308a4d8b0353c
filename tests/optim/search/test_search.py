"""Optuna panel search: trial -> DebateConfig, resumable and shared studies, pruning, MLflow trial runs, no leaked key."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import dspy
import optuna
import pytest
from chateval_cli import RESAMPLES, chateval_few_resamples
from keyholding import varied
from optuna.trial import TrialState

import chateval_dspy.lm.resolve
from chateval_dspy.config import AGGREGATES, DebateConfig
from chateval_dspy.data.loaders import load_faireval, load_topical_chat
from chateval_dspy.data.splits import split
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import DEFAULT_ORDER
from chateval_dspy.program.strategies import STRATEGIES
from chateval_dspy.testing.fake_lm import fake_lm
from optim.search import study as search
from optim.search.objective import Objective, config_of
from optim.search.space import COMPILE_CHOICES, SearchSpace, parse_objectives, suggest_config

PLANTED = "sk-planted-XYZ123456789"


def faireval_parts(limit: int) -> dict:
    return {k: v[:limit] for k, v in split(load_faireval(), seed=0).items()}


# --- the trial -> config mapping ------------------------------------------------------------------------------


def test_every_suggestion_is_a_valid_config():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space, base = SearchSpace(compile=COMPILE_CHOICES), DebateConfig(format="pairwise", calibrate=False)
    seen = {"panel": set(), "n": set(), "compile": set()}
    for _ in range(60):
        trial = study.ask()
        cfg, choice = suggest_config(trial, space, base)
        assert isinstance(cfg, DebateConfig) and not cfg.calibrate and cfg.format == "pairwise"
        assert len(cfg.roles) == trial.params["n_roles"] and 1 <= len(cfg.roles) <= 5
        if trial.params["panel"] == "same":
            assert cfg.roles == tuple(f"referee_{i}" for i in range(1, len(cfg.roles) + 1))
        else:
            assert [r for r in DEFAULT_ORDER if r in cfg.roles] == list(cfg.roles)  # a subset, in the paper's order
        assert 1 <= cfg.turns <= 4 and cfg.strategy in STRATEGIES and cfg.aggregate in AGGREGATES
        assert choice in COMPILE_CHOICES
        seen["panel"].add(trial.params["panel"])
        seen["n"].add(len(cfg.roles))
        seen["compile"].add(choice)
        study.tell(trial, 0.0)
    assert seen == {"panel": {"distinct", "same"}, "n": {1, 2, 3, 4, 5}, "compile": set(COMPILE_CHOICES)}
    build_evaluator(cfg)  # the last one builds


def test_fixed_parameters_give_the_expected_config():
    params = {"panel": "distinct", "n_roles": 2, "personas_2": "critic+scientist", "turns": 3,
              "strategy": "simultaneous_talk", "aggregate": "majority", "compile": "labeled"}
    base = DebateConfig(format="pointwise", parse_retries=0)
    cfg, choice = suggest_config(optuna.trial.FixedTrial(params), SearchSpace(compile=COMPILE_CHOICES), base)
    assert cfg == DebateConfig(format="pointwise", roles=("critic", "scientist"), turns=3, strategy="simultaneous_talk",
                               aggregate="majority", parse_retries=0)
    assert choice == "labeled"
    all_five = {**params, "n_roles": 5, "compile": "none"}
    del all_five["personas_2"]
    assert suggest_config(optuna.trial.FixedTrial(all_five), SearchSpace(), base)[0].roles == DEFAULT_ORDER


def test_panel_flags_fix_dimensions_and_bad_spaces_are_config_errors():
    from optim.cli.main import build_parser
    from optim.cli.search import space_from_args

    args = build_parser().parse_args(["search", "--dataset", "faireval", "--trials", "1", "--strategy", "one_by_one",
                                      "--turns", "2", "--roles", "3", "--compile", "none,bootstrap"])
    space = space_from_args(args)
    assert space.strategies == ("one_by_one",) and space.turns == (2, 2) and space.n_roles == (3, 3)
    assert space.compile == ("none", "bootstrap") and space.aggregates == AGGREGATES
    same = space_from_args(build_parser().parse_args(["search", "--dataset", "faireval", "--trials", "1",
                                                      "--same-role", "2"]))
    assert same.panels == ("same",) and same.n_roles == (2, 2)
    with pytest.raises(ConfigError, match="--roles N"):
        space_from_args(build_parser().parse_args(["search", "--dataset", "faireval", "--trials", "1",
                                                   "--role", "critic"]))
    with pytest.raises(ConfigError, match="panel size"):
        SearchSpace(n_roles=(1, 6))
    with pytest.raises(ConfigError, match="unknown compile"):
        SearchSpace(compile=("mipro",))
    with pytest.raises(ConfigError, match="agreement,tokens"):
        parse_objectives("tokens")


# --- studies --------------------------------------------------------------------------------------------------


def _run(study, parts, n_trials, lm, **kwargs) -> list[int]:
    objective = Objective(space=SearchSpace(turns=(1, 2)), base=DebateConfig(), parts=parts,
                          n_trials=n_trials, n_resamples=RESAMPLES, **kwargs)
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        return search.run_trials(study, objective, n_trials)


def test_a_stopped_study_resumes_at_trial_k_and_never_reruns_a_finished_trial(tmp_path):
    storage, parts = f"sqlite:///{tmp_path / 'optuna.db'}", faireval_parts(3)
    study = search.open_study("resume", storage, ("agreement",), seed=1)
    assert _run(study, parts, 3, fake_lm(varied)) == [0, 1, 2]
    before = {t.number: (t.params, t.values, t.datetime_complete) for t in study.trials}

    again = search.open_study("resume", storage, ("agreement",), seed=1)  # a new process would do the same
    assert _run(again, parts, 5, fake_lm(varied)) == [3, 4]
    trials = again.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert {n: (t.params, t.values, t.datetime_complete) for n, t in enumerate(trials[:3])} == before
    for t in trials[3:]:  # per-trial seeding: no replay of the first run's random draws
        assert t.params not in [p for p, _, _ in before.values()] or "duplicate_of" in t.user_attrs

    idle = fake_lm(varied)
    assert _run(search.open_study("resume", storage, ("agreement",), seed=1), parts, 5, idle) == []
    assert idle.engine.calls == []


def test_an_interrupted_trial_fails_and_the_rerun_completes_the_budget(workdir, capsys):
    calls = []

    def interrupting(call):
        calls.append(call)
        if len(calls) == 30:
            raise KeyboardInterrupt
        return varied(call)

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        yield fake_lm(interrupting)

    argv = ["search", "--dataset", "faireval", "--limit", "3", "--trials", "4", "--turns", "1", "--no-mlflow",
            "--no-test", "--no-progress", "--study", "stop"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
        assert chateval_few_resamples(*argv) == 130
    study = optuna.load_study(study_name="stop", storage="sqlite:///mlruns/optuna.db")
    failed = [t.number for t in study.trials if t.state == TrialState.FAIL]
    finished = {t.number: t.params for t in study.trials if t.state == TrialState.COMPLETE}
    assert len(failed) == 1 and failed[0] == max(t.number for t in study.trials)

    assert chateval_few_resamples(*argv) == 0
    study = optuna.load_study(study_name="stop", storage="sqlite:///mlruns/optuna.db")
    done = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) == 4 and failed[0] not in [t.number for t in done]
    assert {t.number: t.params for t in done if t.number in finished} == finished  # kept, not rerun
    assert "the study holds 4 finished trial(s)" in capsys.readouterr().out


WORKER = textwrap.dedent("""
    import contextlib, pathlib, sys, time
    from chateval_dspy.lm.offline import ensure_offline
    ensure_offline()
    import chateval_dspy.lm.resolve
    from chateval_dspy.testing.fake_lm import fake_lm

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        yield fake_lm(latency=0.005)

    chateval_dspy.lm.resolve.resolve_lm = resolve
    from optim.cli.main import main

    pathlib.Path("ready-" + sys.argv[1]).touch()
    while len(list(pathlib.Path().glob("ready-*"))) < 2:  # start together, so the two really share the study
        time.sleep(0.02)
    sys.exit(main([*sys.argv[2:], "--resamples", "20"]))
""")


@pytest.mark.slow
def test_two_worker_processes_share_one_sqlite_study(tmp_path):
    argv = ["search", "--dataset", "faireval", "--limit", "3", "--trials", "5", "--turns", "1", "--no-mlflow",
            "--no-test", "--no-progress", "--storage", "sqlite:///shared.db", "--study", "shared"]
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPENAI_API_KEY")}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), *argv], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    study = optuna.load_study(study_name="shared", storage=f"sqlite:///{tmp_path / 'shared.db'}")
    done = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(done) == 5 and len({t.number for t in done}) == 5
    assert all(t.user_attrs.get("surplus") for t in study.trials if t.state == TrialState.FAIL)
    assert len({t.user_attrs["worker"] for t in done}) == 2  # both contributed
    ran = sum(int(out.split("ran ")[1].split(" ")[0]) for out, _ in outputs)
    assert ran == len(done)  # a surplus trial (both workers started the last one) is not counted as run


def test_a_panel_drawn_again_is_not_judged_again():
    study = optuna.create_study(direction="maximize")
    one_panel = SearchSpace(panels=("same",), n_roles=(1, 1), turns=(1, 1), strategies=("one_by_one",),
                            aggregates=("mean",))
    objective = Objective(space=one_panel, base=DebateConfig(), parts=faireval_parts(3), n_trials=3,
                          n_resamples=RESAMPLES)
    lm = fake_lm(varied)
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        assert search.run_trials(study, objective, 3) == [0, 1, 2]
    first, *again = study.trials
    assert [t.user_attrs.get("duplicate_of") for t in study.trials] == [None, 0, 0]
    assert all(t.value == first.value and t.user_attrs["dev"] == first.user_attrs["dev"] for t in again)
    assert len(lm.engine.calls) == 3 * DebateConfig(roles=("referee_1",), turns=1).calls_per_item()  # trial 0 only


def test_a_trial_started_past_the_budget_stops_the_worker_quietly(monkeypatch, capfd):
    study = optuna.create_study(direction="maximize")
    study.ask()  # another worker's trial, still running
    checks = iter([1, 0])  # our check said "one left" just before the other worker took it
    monkeypatch.setattr(search, "remaining", lambda study, n: next(checks))
    objective = Objective(space=SearchSpace(), base=DebateConfig(), parts={}, n_trials=1)
    assert search.run_trials(study, objective, 1) == []
    assert [(t.state, t.user_attrs.get("surplus")) for t in study.trials] == [(TrialState.RUNNING, None),
                                                                              (TrialState.FAIL, True)]
    assert "Trial 1" not in capfd.readouterr().err  # an expected stop, not a logged failure with a traceback


def test_pruning_stops_a_trial_after_a_chunk_and_records_what_it_measured(tmp_path):
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(lower=1.01), direction="maximize")
    lm = fake_lm(varied)
    _run(study, faireval_parts(3), 1, lm, report_every=1)
    (trial,) = study.trials
    assert trial.state == TrialState.PRUNED and list(trial.intermediate_values) == [1]
    assert trial.user_attrs["cost"]["items"] == 1
    per_item = len(lm.engine.calls)
    assert per_item == config_of(trial)[0].calls_per_item()  # only the first item was judged


def test_undefined_scoring_agreement_counts_as_zero_and_two_objectives_give_a_pareto_front(tmp_path):
    parts = {k: v[:3] for k, v in split(load_topical_chat(), seed=0).items()}
    study = search.open_study("pointwise", f"sqlite:///{tmp_path / 's.db'}", ("agreement", "tokens"))
    objective = Objective(space=SearchSpace(turns=(1, 1)), base=DebateConfig(format="pointwise"), parts=parts,
                          objectives=("agreement", "tokens"), n_trials=3, n_resamples=RESAMPLES)
    with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):  # constant scores: Spearman is undefined
        search.run_trials(study, objective, 3)
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 3 and all(t.values[0] == 0.0 and t.values[1] > 0 for t in trials)
    assert all(t.user_attrs["agreement_undefined"] for t in trials) and not trials[0].intermediate_values
    best = search.best_trial(study)
    assert best in study.best_trials and best.values[1] == min(t.values[1] for t in study.best_trials)


# --- the command: MLflow and secrets --------------------------------------------------------------------------


@pytest.mark.slow  # over a few seconds
def test_search_logs_nested_trial_runs_saves_the_best_and_leaks_no_key(workdir, tmp_path, monkeypatch, capsys):
    import mlflow

    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    argv = ["search", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--no-progress", "--study", "tracked",
            "--out", "programs/best"]
    assert chateval_few_resamples(*argv, "--trials", "3") == 0
    assert chateval_few_resamples(*argv, "--trials", "4", "--no-log-model") == 0  # resumed: same parent run, one more trial
    out = capsys.readouterr().out
    assert "trial   3" in out and "== best trial" in out and "saved evaluator: programs/best" in out

    study = optuna.load_study(study_name="tracked", storage="sqlite:///mlruns/optuna.db")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["chateval-dspy"], output_format="list")
    (parent,) = [r for r in runs if r.info.run_name == "search-tracked"]
    children = {int(r.data.params["trial"]): r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == [t.number for t in study.trials] == [0, 1, 2, 3]  # one nested run per trial
    for t in study.trials:
        if "duplicate_of" in t.user_attrs:  # logged, but not judged again
            assert children[t.number].data.tags["duplicate_of"] == str(t.user_attrs["duplicate_of"])
            continue
        child = children[t.number]
        assert child.data.params["config.roles"] == ",".join(t.user_attrs["config"]["roles"])
        assert child.data.params["config.turns"] == "1" and child.data.params["compile"] == "none"
        assert child.data.metrics["dev.accuracy_ci_low"] <= child.data.metrics["dev.accuracy"] \
            <= child.data.metrics["dev.accuracy_ci_high"]
        assert child.data.metrics["objective.agreement"] == t.value and child.data.metrics["dev.calls_per_item"] > 0
        assert child.info.run_id == t.user_attrs["mlflow_run_id"]
    assert parent.data.params["dataset"] == "faireval" and "test.accuracy" in parent.data.metrics
    assert parent.data.params["storage"] == "sqlite:optuna.db"  # No path or host of the storage
    client = mlflow.MlflowClient()
    assert {"evaluator/card.json", "evaluator/program.json"} <= {a.path for a in client.list_artifacts(parent.info.run_id,
                                                                                                     "evaluator")}
    card = json.loads((tmp_path / "programs" / "best" / "card.json").read_text())
    best = search.best_trial(study)
    assert card["search"]["study"] == "tracked" and card["search"]["trial"] == best.number
    assert card["config"] == best.user_attrs["config"]
    test = card["test_metrics"]["accuracy"]
    assert test["ci_low"] <= test["value"] <= test["ci_high"] and "accuracy" in card["dev_metrics"]

    models = mlflow.search_logged_models(experiment_ids=[parent.info.experiment_id], output_format="list")
    # the dspy flavour and the pyfunc, from the first run only
    assert sorted(m.name for m in models if m.source_run_id == parent.info.run_id) == ["evaluator", "pyfunc"]

    leaks = [f for f in tmp_path.rglob("*") if f.is_file() and PLANTED.encode() in f.read_bytes()]
    assert leaks == []
    assert any(a.path == "search" for a in client.list_artifacts(parent.info.run_id))


def test_search_refuses_to_mix_settings_into_a_study(workdir, capsys):
    argv = ["search", "--dataset", "faireval", "--trials", "1", "--turns", "1", "--roles", "1", "--no-mlflow",
            "--no-test", "--no-progress", "--study", "fixed"]
    assert chateval_few_resamples(*argv, "--limit", "2") == 0
    assert chateval_few_resamples(*argv, "--limit", "3") == 2
    assert "was run with other settings (limit: study has 2, now 3)" in capsys.readouterr().err


# --- chateval search as a function ----------------------------------------------------------------------------


@pytest.mark.slow  # over a few seconds
def test_run_search_is_the_search_command_as_a_function(workdir, tmp_path):
    """Trials, the final test, the card and the save are one library call on frozen specs."""
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.lm.spec import LMSpec
    from optim.search.run import SearchHooks, run_search
    from optim.search.study_spec import StudySpec

    class Seen(SearchHooks):
        def __init__(self):
            self.trials, self.test = [], None

        def trial(self, study, trial):
            self.trials.append(trial.number)

        def tested(self, trial, result, figures, header):
            self.test = (trial.number, result.n, header["split"])

    seen = Seen()
    done = run_search(DataSpec("faireval", limit=3), DebateConfig(calibrate=False), LMSpec(cache=False),
                      study=StudySpec("lib", trials=2, storage=f"sqlite:///{tmp_path / 'o.db'}"),
                      space=SearchSpace(n_roles=(1, 2), turns=(1, 1)), out=tmp_path / "best", hooks=seen)
    assert done.ran == seen.trials == [0, 1] and done.finished == 2 and done.saved and done.mlflow_run_id is None
    assert seen.test == (done.card["search"]["trial"], 3, "test (seed 0)")
    card = json.loads((tmp_path / "best" / "card.json").read_text())
    assert card["search"] == done.card["search"] and card["config"] == done.card["config"]
    assert done.card["config"]["calibrate"] is False  # the base config's fixed part reached the saved panel
    # The card travels with the model: the storage's kind and database name, no path of this machine.
    assert card["search"]["storage"] == "sqlite:o.db" and str(tmp_path) not in json.dumps(card)
    assert not (tmp_path / "mlruns" / "optuna.db").exists()  # nothing outside what the specs named


@pytest.mark.parametrize("url, label", [
    ("postgresql://optuna:s3cret@db.internal:5432/optuna", "postgresql:optuna"),
    ("postgresql+psycopg2://db.internal/studies?sslmode=require&password=s3cret", "postgresql+psycopg2:studies"),
    ("mysql://root@10.0.0.7:3306/optuna", "mysql:optuna"),
    ("sqlite:////srv/team/mlruns/optuna.db", "sqlite:optuna.db"),
    ("sqlite://", "sqlite"),
    ("postgresql://u:p@db.internal:bad/optuna", "postgresql:optuna"),
    ("db.internal:5432", "storage"),
])
def test_a_storage_url_is_recorded_without_its_host_or_credentials(url, label):
    """What the card and the MLflow params say of a study's storage names no host, port, user, password
    or local path."""
    assert search.storage_label(url) == label


def test_search_flag_defaults_come_from_the_search_space():
    """Unset panel flags leave the space's own ranges (no second copy in the CLI)."""
    from optim.cli.main import build_parser
    from optim.cli.search import space_from_args

    args = build_parser().parse_args(["search", "--dataset", "faireval", "--trials", "1"])
    assert space_from_args(args) == SearchSpace()
    space = space_from_args(args, SearchSpace(turns=(2, 3), n_roles=(2, 4)))
    assert space.turns == (2, 3) and space.n_roles == (2, 4)
    narrowed = build_parser().parse_args(["search", "--dataset", "faireval", "--trials", "1", "--turns", "1"])
    assert space_from_args(narrowed, SearchSpace(turns=(2, 3), n_roles=(2, 4))).turns == (1, 1)


def test_search_space_bounds_come_from_limits():
    """The space draws nothing DebateConfig would refuse, and allows what limits allow."""
    from chateval_dspy import limits

    with pytest.raises(ConfigError, match="limits.MAX_TURNS"):
        SearchSpace(turns=(1, limits.MAX_TURNS + 1))
    assert SearchSpace(turns=(limits.MAX_TURNS, limits.MAX_TURNS)).turns == (limits.MAX_TURNS, limits.MAX_TURNS)
    assert SearchSpace(panels=("same",), n_roles=(7, 7)).n_roles == (7, 7)  # the ablation is not bound to 5 personas
    with pytest.raises(ConfigError, match="limits.MAX_ROLES"):
        SearchSpace(panels=("same",), n_roles=(1, limits.MAX_ROLES + 1))


def test_a_trial_streams_all_its_dev_chunks_to_one_resumable_file(tmp_path):
    """A trial's chunks append to one results file under one run key, so a retry of a
    killed trial can resume it (each chunk used to be keyed apart, and the second was refused)."""
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    objective = Objective(space=SearchSpace(n_roles=(1, 1), turns=(1, 1)), base=DebateConfig(),
                          parts=faireval_parts(3), n_trials=1, report_every=1, results_dir=tmp_path, n_resamples=RESAMPLES)
    with dspy.context(lm=fake_lm(varied), adapter=DebateAdapter()):
        assert search.run_trials(study, objective, 1) == [0]
    rows = [json.loads(line) for line in (tmp_path / "trial-0000-dev.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and len({r["run_key"] for r in rows}) == 1
    assert list(study.trials[0].intermediate_values) == [1, 2, 3]
