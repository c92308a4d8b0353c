"""A compile killed at any point finishes when the same command is rerun.

The killed run is a real process killed with SIGKILL (no cleanup runs); the rerun happens in
this process, against the same fake OpenAI-compatible server, so every LM request is counted.
"""

from __future__ import annotations

import contextlib
import signal
import textwrap

import pytest
from chateval_cli import chateval
from killed_runs import kill_when, lines, slow, spawn, use_mlflow_store

from chateval_dspy.testing.fake_server import FakeOpenAIServer

pytestmark = pytest.mark.slow  # kills whole compile commands and reruns them

BEFORE_CALLS = 3 * 2  # the before-test: 3 test items, 1 referee, 1 turn, both answer orders


@pytest.mark.parametrize("optimizer,kill_at", [("bootstrap", BEFORE_CALLS + 3), ("mipro", BEFORE_CALLS + 12)])
def test_compile_killed_mid_optimization_reruns_to_the_identical_program(tmp_path, monkeypatch, optimizer, kill_at):
    """SIGKILL while the optimizer runs; the rerun repeats no finished LM call
    (at most the one in flight) and saves the very program an uninterrupted compile saves."""
    monkeypatch.chdir(tmp_path)
    common = ["compile", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1",
              "--optimizer", optimizer, "--max-demos", "1", "--no-progress", "--no-mlflow"]
    killed = FakeOpenAIServer(responder=slow)
    with killed as url:
        args = [*common, "--model", url, "--out", str(tmp_path / "killed"), "--cache-dir", str(tmp_path / "cache")]
        proc = spawn(args, tmp_path)
        kill_when(proc, lambda: len(killed.requests) >= kill_at)
        assert lines(tmp_path / "killed" / "results" / "test_before.jsonl") == 3
        assert not (tmp_path / "killed" / "card.json").exists()
        assert chateval(args) == 0
    clean = FakeOpenAIServer(responder=slow)
    with clean as url:
        assert chateval([*common, "--model", url, "--out", str(tmp_path / "clean"),
                    "--cache-dir", str(tmp_path / "cache-clean")]) == 0
    assert (tmp_path / "killed" / "program.json").read_bytes() == (tmp_path / "clean" / "program.json").read_bytes()
    # At most the calls in flight at the kill repeat: one per answer order (the two run at once).
    assert len(clean.requests) <= len(killed.requests) <= len(clean.requests) + 2
    for stage in ("before", "after"):
        assert lines(tmp_path / "killed" / "results" / f"test_{stage}.jsonl") == 3  # nothing judged twice


def test_compile_killed_after_its_card_completes_mlflow_logging_and_registration_when_rerun(
        tmp_path, monkeypatch, mlflow_db):
    """Killed after the card was written but before the model was logged, the rerun
    logs and registers it instead of refusing the folder, and the killed MLflow run ends KILLED."""
    import mlflow

    import chateval_dspy.lm.resolve as lm_module
    from chateval_dspy.testing.fake_lm import fake_lm

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = use_mlflow_store(tmp_path, mlflow_db)
    args = ["compile", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1", "--optimizer", "labeled",
            "--out", "programs/p", "--no-progress", "--no-cache", "--register", "toy-judge"]
    proc = spawn(["optim.tracking.models.log_dspy_model", *args], tmp_path, script=DIES_IN)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, out + err
    assert (tmp_path / "programs/p/card.json").exists()

    @contextlib.contextmanager
    def resolve(*a, **k):
        yield fake_lm()

    monkeypatch.setattr(lm_module, "resolve_lm", resolve)
    assert chateval(args) == 0
    mlflow.set_tracking_uri(f"sqlite:///{store}")
    runs = mlflow.search_runs(experiment_names=["chateval-dspy"], output_format="list")
    compiles = sorted((r for r in runs if r.info.run_name == "compile"), key=lambda r: r.info.start_time)
    assert [r.info.status for r in compiles] == ["KILLED", "FINISHED"]
    assert [r.info.run_id for r in runs if r.info.status == "RUNNING"] == []  # the optimizer's child runs too
    (version,) = mlflow.MlflowClient().search_model_versions("name='toy-judge'")
    assert version.run_id == compiles[1].info.run_id
    assert chateval(args) == 2  # a finished evaluator is never overwritten


# Runs ``chateval ARGS`` on the scripted fake LM, and SIGKILLs itself when ``<module>.<NAME>`` is called.
DIES_IN = textwrap.dedent("""
    import contextlib, os, signal, sys
    from chateval_dspy.lm.offline import ensure_offline
    ensure_offline()
    import chateval_dspy.lm.resolve
    from chateval_dspy.testing.fake_lm import fake_lm

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        yield fake_lm()

    chateval_dspy.lm.resolve.resolve_lm = resolve
    import importlib
    module, name = sys.argv[1].rsplit(".", 1)
    setattr(importlib.import_module(module), name, lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))
    from optim.cli.main import main
    sys.exit(main([*sys.argv[2:], "--resamples", "20"]))
""")


def test_a_folder_bound_to_another_compile_is_refused_with_what_differs(tmp_path, monkeypatch):
    """The rerun resumes only the same compile; another one is told what differs."""
    from chateval_dspy.errors import ConfigError
    from optim.tuning.compile import CompileFolder

    folder = CompileFolder(tmp_path / "p")
    state = folder.claim("k1", {"optimizer": "labeled"})
    assert folder.claim("k1", {"optimizer": "labeled"}) == state  # the same compile resumes
    with pytest.raises(ConfigError, match="optimizer: 'labeled' there, 'bootstrap' now"):
        folder.claim("k2", {"optimizer": "bootstrap"})
    folder.update(done=True)
    with pytest.raises(ConfigError, match="already holds a compiled evaluator"):
        folder.claim("k1", {"optimizer": "labeled"})
