"""An interrupted or shared search finishes, tested and saved, when rerun.

Kills are real SIGKILLs of a worker process (no cleanup runs); the rerun happens in this process
against the same fake OpenAI-compatible server, so every LM request is counted. The searches run
with ``--no-cache``: what keeps a finished LM call from repeating is then the results files alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import optuna
import pytest
from chateval_cli import chateval
from killed_runs import kill_when, lines, slow, spawn, use_mlflow_store
from optuna.trial import TrialState

from chateval_dspy.testing.fake_server import FakeOpenAIServer
from optim.search import study as studies
from optim.search.worker import Worker

pytestmark = pytest.mark.slow  # kills whole search commands and reruns them

SEARCH = ["search", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1", "--no-progress",
          "--no-cache", "--study", "s", "--out", "programs/s"]


def _runs(store):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}")
    return mlflow.search_runs(experiment_names=["chateval-dspy"], output_format="list")


def _clean_run(tmp_path, monkeypatch, argv) -> FakeOpenAIServer:
    """The same search, never interrupted, in a folder of its own: the reference for calls and program."""
    (tmp_path / "clean").mkdir()
    monkeypatch.chdir(tmp_path / "clean")
    clean = FakeOpenAIServer(responder=slow)
    with clean as url:
        assert chateval([*argv, "--model", url, "--no-mlflow"]) == 0
    return clean


def test_search_killed_in_a_trial_finishes_and_saves_on_the_first_rerun(tmp_path, monkeypatch, capsys,
                                                                        mlflow_db):
    """Rerun at once after a SIGKILL in trial 0, the search fails the dead
    trial without waiting for its heartbeat, draws its panel again (resuming its dev results), runs
    the rest of the budget, tests and saves; the killed trial's MLflow run ends KILLED."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = use_mlflow_store(tmp_path, mlflow_db)
    argv = [*SEARCH, "--trials", "2"]
    killed = FakeOpenAIServer(responder=slow)
    with killed as url:
        proc = spawn([*argv, "--model", url], tmp_path)
        kill_when(proc, lambda: lines(tmp_path / "results" / "s" / "trial-0000-dev.jsonl") >= 1)
        assert chateval([*argv, "--model", url]) == 0
    out = capsys.readouterr().out
    assert "saved evaluator: programs/s" in out and "still running" not in out

    study = optuna.load_study(study_name="s", storage="sqlite:///mlruns/optuna.db")
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    dead, retry = study.trials[0], study.trials[1]
    assert retry.params == dead.params and retry.user_attrs["resumed_from"] == 0
    assert lines(tmp_path / "results" / "s" / "trial-0001-dev.jsonl") == 3
    card = json.loads((tmp_path / "programs" / "s" / "card.json").read_text())
    assert card["search"]["trials_finished"] == 2

    runs = _runs(store)
    assert [r for r in runs if r.info.status == "RUNNING"] == []
    trial_runs = {r.data.tags.get("optuna.trial"): r.info.status for r in runs if "optuna.trial" in r.data.tags}
    assert trial_runs == {"0": "KILLED", "1": "FINISHED", "2": "FINISHED"}

    clean = _clean_run(tmp_path, monkeypatch, argv)
    assert (tmp_path / "programs/s/program.json").read_bytes() == \
        (tmp_path / "clean/programs/s/program.json").read_bytes()
    # At most the calls in flight at the kill repeat: one per answer order (the two run at once).
    assert len(clean.requests) <= len(killed.requests) <= len(clean.requests) + 2


def test_search_killed_in_its_final_test_resumes_the_test_and_saves(tmp_path, monkeypatch):
    """Killed while judging the test split, the rerun accepts its own
    unfinished folder, judges only the test items left, and saves the program."""
    monkeypatch.chdir(tmp_path)
    argv = [*SEARCH, "--trials", "1", "--no-mlflow"]
    test_file = tmp_path / "programs" / "s" / "results" / "test.jsonl"
    killed = FakeOpenAIServer(responder=slow)
    with killed as url:
        proc = spawn([*argv, "--model", url], tmp_path)
        kill_when(proc, lambda: lines(test_file) >= 1)
        assert not (tmp_path / "programs" / "s" / "card.json").exists()
        assert chateval([*argv, "--model", url]) == 0
    assert lines(test_file) == 3 and (tmp_path / "programs" / "s" / "card.json").exists()
    clean = _clean_run(tmp_path, monkeypatch, argv)
    assert (tmp_path / "programs/s/program.json").read_bytes() == \
        (tmp_path / "clean/programs/s/program.json").read_bytes()
    # At most the calls in flight at the kill repeat: one per answer order (the two run at once).
    assert len(clean.requests) <= len(killed.requests) <= len(clean.requests) + 2


WORKER = textwrap.dedent("""
    import contextlib, pathlib, sys, time
    from chateval_dspy.lm.offline import ensure_offline
    ensure_offline()
    import chateval_dspy.lm.resolve
    from chateval_dspy.testing.fake_lm import default_responder, fake_lm

    def responder(call):
        if sys.argv[1] == "slow":  # its one trial stays open until the test lets it go
            pathlib.Path("calling-slow").touch()
            while not pathlib.Path("release").exists():
                time.sleep(0.02)
        return default_responder(call)

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        yield fake_lm(responder)

    chateval_dspy.lm.resolve.resolve_lm = resolve
    from optim.cli.main import main

    # The fast worker starts once the slow one is in a trial, so the two share the study however loaded the machine.
    while sys.argv[1] == "fast" and not pathlib.Path("calling-slow").exists():
        time.sleep(0.02)
    sys.exit(main([*sys.argv[2:], "--resamples", "20"]))
""")
WAITING = "waiting for 1 trial(s) still running in other workers"


def test_two_workers_share_one_parent_run_and_the_study_ends_tested_whoever_finishes_last(
        tmp_path, mlflow_db):
    """The README's pattern, a slow ``--no-test`` worker in the background and a fast
    one in front: one MLflow parent run holds every trial, and the front worker waits for the other's
    last trial, then tests and saves the best panel. The slow worker's trial is held open until the fast one says
    it waits, so the order does not depend on the machine's load."""
    store = use_mlflow_store(tmp_path, mlflow_db)
    argv = ["search", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1", "--trials", "4",
            "--no-progress", "--study", "shared", "--out", "programs/shared", "--no-log-model"]
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPENAI_API_KEY")}
    env["PYTHONUNBUFFERED"] = "1"  # the fast worker's lines reach its file as they are printed
    out = {name: tmp_path / f"{name}.out" for name in ("slow", "fast")}

    def worker(name: str, *extra: str) -> subprocess.Popen:
        with out[name].open("w") as stdout:
            return subprocess.Popen([sys.executable, "-c", WORKER, name, *argv, *extra], cwd=tmp_path, env=env,
                                    stdout=stdout, stderr=subprocess.STDOUT, text=True)

    workers = [worker("slow", "--no-test"), worker("fast")]
    deadline = time.monotonic() + 240
    while WAITING not in out["fast"].read_text() and workers[1].poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "release").touch()
    codes = [w.wait(timeout=300) for w in workers]
    slow_out, fast_out = (out[name].read_text() for name in ("slow", "fast"))
    assert codes == [0, 0], slow_out[-3000:] + fast_out[-3000:]
    assert WAITING in fast_out
    assert "saved evaluator: programs/shared" in fast_out and "--no-test" in slow_out

    study = optuna.load_study(study_name="shared", storage=f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}")
    done = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(done) == 4 and len({t.user_attrs["worker"] for t in done}) == 2
    card = json.loads((tmp_path / "programs" / "shared" / "card.json").read_text())
    assert card["search"]["trials_finished"] == 4  # tested only once the slow worker's trial was in

    runs = _runs(store)
    (parent,) = [r for r in runs if r.info.run_name == "search-shared"]
    trial_runs = [r for r in runs if "optuna.trial" in r.data.tags]
    assert len(trial_runs) == 4 and {r.data.tags["mlflow.parentRunId"] for r in trial_runs} == {parent.info.run_id}
    assert "test.accuracy" in parent.data.metrics and parent.info.status == "FINISHED"
    assert [r for r in runs if r.info.status == "RUNNING"] == []


def test_claiming_a_study_attribute_is_first_writer_wins_across_workers(tmp_path):
    """Workers that start a study together agree on one parent run (one value)."""
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    studies.open_study("race", storage, ("agreement",))
    n = 6
    barrier, won = threading.Barrier(n), [None] * n

    def worker(i: int) -> None:
        study = studies.open_study("race", storage, ("agreement",))  # a storage of its own, as a process has
        barrier.wait()
        won[i] = studies.claim_attr(study, "mlflow_run:x", f"run-{i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(won)) == 1 and won[0].startswith("run-")
    assert optuna.load_study(study_name="race", storage=storage).user_attrs["mlflow_run:x"] == won[0]


def test_only_trials_of_workers_known_dead_are_failed(tmp_path):
    """A RUNNING trial whose worker on this host has exited is failed at once; one of a
    live worker, or of another host (left to Optuna's heartbeat), is not."""
    study = studies.open_study("dead", f"sqlite:///{tmp_path / 'o.db'}", ("agreement",))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    me = Worker.current()
    if me.started is None:
        pytest.skip("needs /proc to tell a reused pid from its first process")
    tags = [Worker(me.host, ended.pid).tag(),  # exited
            me.tag(),  # alive
            Worker(me.host, os.getpid(), me.started + 1).tag(),  # our pid, once held by a process now gone
            "elsewhere:1:1"]  # another host
    with warnings.catch_warnings():  # Optuna warns that heartbeats are meant for optimize(); these trials are asked
        warnings.simplefilter("ignore", UserWarning)
        for tag in tags:
            study.ask().set_user_attr("worker", tag)
        study.ask()  # a trial whose worker is not known yet
    assert [t.number for t in studies.fail_dead_trials(study)] == [0, 2]
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.FAIL,
                                               TrialState.RUNNING, TrialState.RUNNING]
    assert studies.remaining(study, 5) == 2


@pytest.mark.parametrize("tag", ["", "nocolon", "host:notapid", None, 7])
def test_an_unreadable_worker_tag_is_never_taken_for_dead(tag):
    """Only a trial whose worker is known to have ended is failed early."""
    from optim.search.worker import dead

    assert dead(tag) is False
