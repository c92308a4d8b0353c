"""Commands killed mid-run with SIGKILL and rerun (shared by test_compile_resume, test_search_resume and
test_search_orphans): the process, the kill point, and the MLflow store the rerun finds."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chateval_dspy.testing.fake_lm import default_responder


def slow(call):
    """Answers as the fake LM does, slowly enough that a kill lands in the middle of something."""
    time.sleep(0.02)
    return default_responder(call)


def spawn(args: list[str], cwd: Path, script: str | None = None) -> subprocess.Popen:
    """``chateval ARGS`` in its own process (or ``script`` with ARGS), output captured."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPENAI_API_KEY")}
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "optim.cli.main"]
    return subprocess.Popen([*command, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds; fail if it ended first (the kill must land mid-run)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.005)
    if proc.poll() is not None:
        out, err = proc.communicate()
        pytest.fail(f"the process ended (exit {proc.returncode}) before the kill point\n{out}\n{err}")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)  # reaped: the rerun sees the process gone, not a zombie
    assert proc.returncode == -signal.SIGKILL


def lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def use_mlflow_store(cwd: Path, template: Path) -> Path:
    """The default local store (``./mlruns/mlflow.db``) of a command run in ``cwd``, already migrated."""
    (cwd / "mlruns").mkdir(parents=True, exist_ok=True)
    shutil.copy(template, cwd / "mlruns" / "mlflow.db")
    return cwd / "mlruns" / "mlflow.db"
