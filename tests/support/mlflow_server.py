"""A real ``mlflow server`` for tests: sqlite backend, temporary artifact root, loopback, no job
runner. Import the fixture into a test module: ``from mlflow_server import tracking_server, mlflow_db  # noqa: F401``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from test_search import mlflow_db  # noqa: F401 - the MLflow store template, shared


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM a process started in its own session and everything it started; SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory, mlflow_db):  # noqa: F811 - the shared template fixture
    """``(uri, root)`` of a real ``mlflow server``; everything it stores lies under ``root``."""
    root = tmp_path_factory.mktemp("mlflow-server")
    shutil.copy(mlflow_db, root / "server.db")  # already migrated: the server starts in seconds
    port = _free_port()
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
        yield uri, root
    finally:
        stop_group(proc)
        log.close()
