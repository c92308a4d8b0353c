"""MLflow tracking of evaluate and compile (issue #3), and no secret in anything a run writes."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from chateval_dspy.testing.fake_lm import ScriptedEngine

PLANTED = "sk-planted-SECRET-0123456789"


class KeyHoldingEngine(ScriptedEngine):
    """A fake engine that, like a real client, holds the API key: if anything pickled the LM, the key would leak."""

    def __init__(self):
        super().__init__()
        self.api_key = os.environ["OPENAI_API_KEY"]


@pytest.fixture
def tracked_cli(tmp_path, monkeypatch):
    import dspy

    import chateval_dspy.lm.resolve as lm_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    @contextlib.contextmanager
    def fake_resolve(*args, **kwargs):
        yield dspy.LM("fake/keyholder", engine=KeyHoldingEngine(), cache=False, num_retries=0)

    monkeypatch.setattr(lm_module, "resolve_lm", fake_resolve)
    from optim.cli.main import main

    return main


def _files_under(*roots: Path):
    for root in roots:
        for f in root.rglob("*"):
            if f.is_file():
                yield f


@pytest.mark.slow
def test_evaluate_and_compile_land_in_mlflow_without_secrets(tracked_cli, tmp_path, capsys):
    import mlflow

    assert tracked_cli(["evaluate", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--no-progress",
                        "--out", "r.jsonl"]) == 0
    assert tracked_cli(["compile", "--dataset", "faireval", "--limit", "4", "--turns", "1", "--optimizer", "labeled",
                        "--out", "programs/toy", "--no-progress"]) == 0
    assert (tmp_path / "mlruns" / "mlflow.db").exists()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["chateval-dspy"], output_format="list")
    by_name = {r.info.run_name: r for r in runs}
    ev, comp = by_name["evaluate"], by_name["compile"]
    assert ev.data.params["config.strategy"] == "one_by_one" and ev.data.params["model"] == "fake/keyholder"
    assert len(ev.data.params["dataset_hash"]) == 16
    assert {"accuracy", "accuracy_ci_low", "accuracy_ci_high", "kappa", "calls_per_item"} <= set(ev.data.metrics)
    assert comp.data.params["optimizer"] == "labeled"
    assert {"test_before.accuracy", "test_after.accuracy", "test_after.accuracy_ci_high"} <= set(comp.data.metrics)
    client = mlflow.MlflowClient()
    arts = {a.path for a in client.list_artifacts(comp.info.run_id, "evaluator")}
    assert {"evaluator/card.json", "evaluator/program.json"} <= arts
    card = json.loads((tmp_path / "programs" / "toy" / "card.json").read_text())
    assert card["optimizer"] == "labeled" and "before" in card["test_metrics"] and "after" in card["test_metrics"]
    assert card["test_metrics"]["after"]["accuracy"]["ci_low"] <= card["test_metrics"]["after"]["accuracy"]["value"]
    # The planted key is nowhere: not in params, artifacts, the pickled MLflow model, programs or results.
    leaks = [f for f in _files_under(tmp_path) if PLANTED.encode() in f.read_bytes()]
    assert leaks == []
    assert "mlflow run:" in capsys.readouterr().out


def test_assert_no_secrets_refuses_a_text_holding_a_key(monkeypatch):
    from optim.tracking.runs import assert_no_secrets

    monkeypatch.setenv("MY_SERVICE_TOKEN", PLANTED)
    assert_no_secrets("nothing to hide", "x")
    with pytest.raises(RuntimeError, match="credential"):
        assert_no_secrets(f"header {PLANTED}", "x")


def _local_store(tmp_path, monkeypatch, template) -> None:
    import shutil

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(template, tmp_path / "mlruns" / "mlflow.db")


def test_runs_of_a_dead_worker_end_killed_with_their_children_and_nothing_else(tmp_path, monkeypatch,
                                                                              mlflow_db):
    """A killed command's RUNNING runs (and the optimizer's child runs under them) are
    ended as KILLED by the rerun; runs of live workers, other hosts or other folders are left alone."""
    import subprocess
    import sys

    import mlflow

    from optim.search.worker import Worker
    from optim.tracking import runs as tracking

    _local_store(tmp_path, monkeypatch, mlflow_db)
    tracking.setup()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    me = Worker.current()
    client = mlflow.MlflowClient()
    experiment = mlflow.get_experiment_by_name(tracking.EXPERIMENT).experiment_id

    def started(out, worker, parent=None):
        tags = {"chateval.out": out, **({tracking.WORKER_TAG: worker} if worker else {}),
                **({"mlflow.parentRunId": parent} if parent else {})}
        return client.create_run(experiment, tags=tags).info.run_id

    dead = started("a", Worker(me.host, ended.pid).tag())
    child = started("a", None, parent=dead)
    grandchild = started("a", None, parent=child)
    alive, elsewhere, other_folder = started("a", me.tag()), started("a", "otherhost:1:1"), \
        started("b", Worker(me.host, ended.pid).tag())
    assert sorted(tracking.end_dead_runs({"chateval.out": "a"})) == sorted([dead, child, grandchild])
    status = {r: client.get_run(r).info.status for r in (dead, child, grandchild, alive, elsewhere, other_folder)}
    assert status == {dead: "KILLED", child: "KILLED", grandchild: "KILLED", alive: "RUNNING",
                      elsewhere: "RUNNING", other_folder: "RUNNING"}


def test_a_run_that_raises_ends_failed_and_is_tagged_with_its_worker(tmp_path, monkeypatch, mlflow_db):
    """An exception ends the run FAILED (never RUNNING), and every run names its worker."""
    import mlflow

    from optim.search.worker import Worker
    from optim.tracking import runs as tracking

    _local_store(tmp_path, monkeypatch, mlflow_db)
    with pytest.raises(RuntimeError), tracking.run("x", params={}) as active:
        raise RuntimeError("boom")
    run = mlflow.MlflowClient().get_run(active.info.run_id)
    assert run.info.status == "FAILED" and run.data.tags[tracking.WORKER_TAG] == Worker.current().tag()


@pytest.fixture
def default_sigterm():
    """SIGTERM at its default, as in a fresh process: a library an earlier test used (Ray) may have set a handler."""
    import signal

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_ctrl_c_and_sigterm_end_the_run_and_its_open_child_killed(tmp_path, monkeypatch, mlflow_db,
                                                                  default_sigterm):
    """A run stopped by Ctrl-C or SIGTERM ends KILLED, the child run open in it too; SIGTERM
    becomes ``Terminated`` only while a run is open, and MLflow's link lines are switched off only meanwhile."""
    import signal

    import mlflow

    from optim.tracking import runs as tracking

    _local_store(tmp_path, monkeypatch, mlflow_db)
    monkeypatch.delenv(tracking.URL_SWITCH, raising=False)
    with pytest.raises(KeyboardInterrupt), tracking.run("x", params={}) as parent, \
            tracking.run("child", params={}, nested=True) as child:
        raise KeyboardInterrupt
    client = mlflow.MlflowClient()  # on the store the run was pointed at
    assert [client.get_run(r.info.run_id).info.status for r in (parent, child)] == ["KILLED", "KILLED"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(tracking.Terminated) as stopped, tracking.run("y", params={}) as active:
        assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL and os.environ[tracking.URL_SWITCH] == "true"
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # the handler runs in this thread between two bytecodes
            time.sleep(0.01)
    assert stopped.value.signum == signal.SIGTERM and client.get_run(active.info.run_id).info.status == "KILLED"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and tracking.URL_SWITCH not in os.environ
    with tracking.run("z", params={}) as active:
        pass
    assert client.get_run(active.info.run_id).info.status == "FINISHED"


def test_sigterm_is_left_alone_off_the_main_thread_and_under_a_handler_of_ones_own(default_sigterm):
    import signal
    import threading

    from optim.tracking.runs import sigterm_interrupts

    seen = []

    def in_thread():
        with sigterm_interrupts():
            seen.append(signal.getsignal(signal.SIGTERM))
    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    assert seen == [signal.SIG_DFL]

    def mine(signum, frame):
        pass
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with sigterm_interrupts():
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
def test_a_tracking_spec_costs_no_mlflow_import():
    """The CLI builds a TrackingSpec even with --no-mlflow; that must not import mlflow (2-3 s)."""
    import subprocess
    import sys

    code = "import sys, optim.tracking.runs as t; t.TrackingSpec(enabled=False); print('mlflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_compile_autologging_is_switched_off_on_the_way_out():
    """MLflow's DSPy autologging patches the whole process: a compile must not leave it on for whatever runs next
    (it would log the next compile to this run's tracking server, and hang retrying when that server is gone)."""
    from mlflow.utils.autologging_utils import autologging_is_disabled

    from optim.tracking.runs import autolog_compiles

    with autolog_compiles():
        assert not autologging_is_disabled("dspy")
    assert autologging_is_disabled("dspy")
