"""A real ``mlflow server`` for tests: sqlite backend, temporary artifact root, loopback, no job runner. The
``tracking_server`` fixture (tests/conftest.py) starts one per test module."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from local_http import free_port


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM a process started in its own session and everything it started; SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def mlflow_server(root: Path, template: Path):
    """The URI of a real ``mlflow server`` whose store starts as a copy of ``template``; everything it stores lies
    under ``root``."""
    shutil.copy(template, root / "server.db")  # already migrated: the server starts in seconds
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed at teardown
    # Its own session (process group), so that the server and the uvicorn worker it starts end together.
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{root / 'server.db'}", "--default-artifact-root", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:  # noqa: S310 - loopback
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.3)
        yield uri
    finally:
        stop_group(proc)
        log.close()
