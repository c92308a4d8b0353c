"""A LiteLLM proxy on loopback for tests (``tests/chateval_dspy/lm/test_gateway.py``):
``with Gateway(config_path, env) as gw: gw.url``.

The proxy runs from its own venv (``.gateway/bin/litellm``; litellm[proxy]'s pins conflict with the main venv's),
which the first ``Gateway`` builds with uv (seconds, from the package index) and later runs reuse. It runs offline:
the local cost map, telemetry off, no database. ``gw.url`` is its OpenAI-compatible base URL (``.../v1``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from local_http import free_port
from repo_paths import ROOT

VENV = ROOT / ".gateway"
LITELLM = VENV / "bin" / "litellm"
LITELLM_RELEASE = "1.108"  # the proxy the tests were written against
REQUIREMENT = f"litellm[proxy,caching]=={LITELLM_RELEASE}.*"
# What keeps the proxy offline and quiet: the cost map shipped with litellm, no telemetry, no update checks.
OFFLINE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY_DISABLED": "true",
               "LITELLM_MODE": "PRODUCTION", "LITELLM_LOG": "ERROR", "DISABLE_ADMIN_UI": "True",
               "NO_DOCS": "True", "NO_REDOC": "True"}
START_TIMEOUT_S = 90.0


def _built() -> bool:
    return LITELLM.exists() and any(VENV.glob(f"lib/python*/site-packages/litellm-{LITELLM_RELEASE}.*.dist-info"))


def _uv(*args: str) -> None:
    uv = shutil.which("uv", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if uv is None:
        raise RuntimeError('uv is not installed (pip install -e ".[dev]" installs it): it builds the proxy\'s venv')
    done = subprocess.run([uv, *args], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"uv {args[0]} for the LiteLLM proxy's venv {VENV} failed: {done.stderr[-3000:]}")


def ensure_proxy() -> Path:
    """``.gateway/bin/litellm``, the venv built first if it is absent or holds another release of litellm."""
    if _built():
        return LITELLM
    # One build at a time across test processes: a second waits, then finds the venv built.
    with open(Path(tempfile.gettempdir()) / "chateval-gateway.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _built():
            _uv("venv", "--clear", "--quiet", "--python", sys.executable, str(VENV))
            _uv("pip", "install", "--quiet", "--python", str(VENV / "bin" / "python"), REQUIREMENT)
    return LITELLM


def _alive(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=2) as resp:  # noqa: S310
            return resp.status == 200
    except OSError:
        return False


class Gateway:
    """The proxy started with ``config`` (a YAML file) and ``env`` added to the offline environment.

    ``started_s`` is how long it took to answer its unauthenticated ``/health/liveliness``; its output is in
    ``log`` (a file beside the config), shown when it fails to start.
    """

    def __init__(self, config: Path, env: dict[str, str] | None = None, port: int | None = None):
        self.config, self.port = Path(config), port or free_port()
        self.env = {**os.environ, **OFFLINE_ENV, **(env or {})}
        self.log = self.config.with_suffix(".log")
        self.started_s: float | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Gateway:
        litellm = ensure_proxy()
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            # Its own session, so that teardown can stop the proxy's worker processes with it.
            self._proc = subprocess.Popen([str(litellm), "--config", str(self.config), "--host", "127.0.0.1",
                                           "--port", str(self.port)], env=self.env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        while not _alive(self.port):
            if self._proc.poll() is not None or time.monotonic() - t0 > START_TIMEOUT_S:
                self.__exit__()
                raise RuntimeError(f"the LiteLLM proxy did not start: {self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.25)
        self.started_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
