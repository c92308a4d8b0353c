"""A killed search worker's trial run does not stay RUNNING in MLflow once Optuna fails its trial.

A worker on another host cannot be seen to die: Optuna's heartbeat fails its trial after the grace period, and another
worker runs the trial's panel again. Its MLflow run, which the killed worker could not end, is ended then as KILLED
with a note, by whichever worker sees the trial failed.
"""

from __future__ import annotations

import contextlib
import textwrap
import time
import warnings

import optuna
import pytest
from killed_runs import spawn, use_mlflow_store
from optuna.trial import TrialState

from chateval_dspy.config import DebateConfig
from optim.search import study as studies
from optim.search.space import SearchSpace

ELSEWHERE = "elsewhere:4242:1"  # a worker on another host: this host cannot tell whether it lives


def _runs(store):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}")
    return mlflow.search_runs(experiment_names=["chateval-dspy"], output_format="list")


@pytest.mark.slow  # over a few seconds
def test_a_trial_failed_by_the_heartbeat_has_its_run_ended_by_the_next_worker(workdir, tmp_path):
    """A study holds a trial that Optuna failed (as its heartbeat does for a worker on another host that stopped)
    while its MLflow run is RUNNING. The next worker's search ends that run as KILLED with a note; the check at start
    (``end_dead_runs``) cannot, as it cannot tell that the other host's worker died."""
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.lm.spec import LMSpec
    from optim.search.run import run_search
    from optim.search.study_spec import StudySpec
    from optim.tracking import runs as tracking

    store = tmp_path / "mlruns" / "mlflow.db"
    uri, storage = f"sqlite:///{store}", f"sqlite:///{tmp_path / 'o.db'}"
    orphan = tracking.create_run("trial-0", uri=uri, tags={"optuna.study": "orph", "optuna.trial": "0",
                                                          tracking.WORKER_TAG: ELSEWHERE})
    study = studies.open_study("orph", storage, ("agreement",))
    with warnings.catch_warnings():  # Optuna warns that heartbeats are meant for optimize(); this trial is asked
        warnings.simplefilter("ignore", UserWarning)
        trial = study.ask()
    trial.set_user_attr("worker", ELSEWHERE)
    trial.set_user_attr("mlflow_run_id", orphan)
    study.tell(trial.number, state=TrialState.FAIL)  # what the heartbeat does once the grace period is over

    done = run_search(DataSpec("faireval", limit=3), DebateConfig(calibrate=False), LMSpec(cache=False),
                      study=StudySpec("orph", trials=1, storage=storage), space=SearchSpace(n_roles=(1, 1), turns=(1, 1)),
                      out=tmp_path / "best", tracking=tracking.TrackingSpec(uri=uri, log_model=False))
    assert done.saved and done.finished == 1
    runs = {r.info.run_id: r for r in _runs(store)}
    assert [r.info.run_name for r in runs.values() if r.info.status == "RUNNING"] == []
    assert runs[orphan].info.status == "KILLED"
    note = runs[orphan].data.tags[studies.NOTE_TAG]
    assert "trial 0" in note and ELSEWHERE in note
    assert sorted(r.info.status for r in runs.values() if r.data.tags.get("optuna.trial") == "1") == ["FINISHED"]


def test_runs_of_failed_trials_already_ended_or_gone_are_left_alone(tmp_path, mlflow_db):
    """Only a RUNNING run is ended: one that ended (the trial failed in its own worker: FAILED) keeps its status,
    and a run id the store does not hold is skipped."""
    from optim.tracking import runs as tracking

    uri = f"sqlite:///{use_mlflow_store(tmp_path, mlflow_db)}"
    ended = tracking.create_run("trial-0", uri=uri, tags={"optuna.study": "x"})
    tracking.end_run(ended, "FAILED", uri)
    study = optuna.create_study()
    for run_id in (ended, "0123456789abcdef0123456789abcdef"):
        trial = study.ask()
        trial.set_user_attr("mlflow_run_id", run_id)
        study.tell(trial, state=TrialState.FAIL)
    assert studies.end_failed_trial_runs(study.trials, uri) == []
    assert {r.info.run_id: r.info.status for r in _runs(tmp_path / "mlruns" / "mlflow.db")} == {ended: "FAILED"}


# A search worker whose host is called ``sys.argv[1]``, with an LM taking ``sys.argv[2]`` seconds a call and Optuna
# heartbeats every second, a trial failed 10 s after its worker's last one (long enough for a busy machine).
WORKER = textwrap.dedent("""
    import contextlib, socket, sys
    from chateval_dspy.lm.offline import ensure_offline
    ensure_offline()
    import chateval_dspy.lm.resolve
    from chateval_dspy.testing.fake_lm import fake_lm
    from optim.search import study

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        yield fake_lm(latency=float(sys.argv[2]))

    chateval_dspy.lm.resolve.resolve_lm = resolve
    host = sys.argv[1]
    socket.gethostname = lambda: host
    study.HEARTBEAT_S, study.GRACE_S = 1, 10
    from optim.cli.main import main

    sys.exit(main([*sys.argv[3:], "--resamples", "20"]))
""")


def _trials(storage: str) -> list:
    with contextlib.suppress(Exception):  # the study not created yet (KeyError), or its file busy this instant
        return optuna.load_study(study_name="k", storage=storage).get_trials(deepcopy=False)
    return []


def _wait(what, ready, procs, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                pytest.fail(f"a worker ended (exit {p.returncode}) before {what}\n{out}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow  # two search processes, a SIGKILL and a heartbeat grace period
def test_a_killed_workers_trial_run_is_ended_when_the_heartbeat_fails_its_trial(tmp_path, mlflow_db):
    """Worker A (host "far") runs trial 0 with a slow LM; worker B (host "near") joins, runs trial 1, then waits
    for A. A is SIGKILLed mid-trial: B cannot see A's process, Optuna's heartbeat fails trial 0, and B runs its panel
    again, tests and saves. Afterwards no MLflow run of the study is RUNNING: A's trial run ended KILLED, with a note."""
    store = use_mlflow_store(tmp_path, mlflow_db)
    storage = f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}"
    argv = ["search", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1", "--trials", "2",
            "--no-progress", "--study", "k", "--out", "programs/k", "--no-log-model"]
    a = spawn(["far", "30", *argv, "--no-test"], tmp_path, script=WORKER)
    b = None
    try:
        _wait("A's trial 0 to start its MLflow run", lambda: any(
            t.number == 0 and t.state == TrialState.RUNNING and "mlflow_run_id" in t.user_attrs
            for t in _trials(storage)), [a])
        b = spawn(["near", "0.001", *argv], tmp_path, script=WORKER)
        _wait("B's trial 1 to finish", lambda: any(
            t.number == 1 and t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in _trials(storage)), [a, b])
        assert _trials(storage)[0].state == TrialState.RUNNING  # A is still in its first LM call
        a.kill()
        a.communicate(timeout=30)
        out, err = b.communicate(timeout=300)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    assert b.returncode == 0, out + err[-3000:]
    assert "saved evaluator: programs/k" in out

    trials = optuna.load_study(study_name="k", storage=storage).trials
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["worker"].startswith("far:")
    assert len([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 2
    runs = _runs(store)
    assert [(r.info.run_name, r.data.tags.get("optuna.trial")) for r in runs if r.info.status == "RUNNING"] == []
    (killed,) = [r for r in runs if r.info.run_id == trials[0].user_attrs["mlflow_run_id"]]
    assert killed.info.status == "KILLED" and "trial 0" in killed.data.tags[studies.NOTE_TAG]
    assert "ended by worker near:" in killed.data.tags[studies.NOTE_TAG].lower()
