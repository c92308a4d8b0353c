"""A LiteLLM proxy on loopback for tests (``tests/test_gateway.py``): ``with Gateway(config_path, env) as gw: gw.url``.

The proxy runs from its own venv (``.gateway/bin/litellm``; litellm[proxy] cannot share the main venv), offline:
the local cost map, telemetry off, no database. ``gw.url`` is its OpenAI-compatible base URL (``.../v1``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LITELLM = ROOT / ".gateway" / "bin" / "litellm"
MISSING = f"the LiteLLM proxy venv is absent ({LITELLM}): python -m venv .gateway && " \
          '.gateway/bin/pip install "litellm[proxy,caching]>=1.108,<1.109"'
# What keeps the proxy offline and quiet: the cost map shipped with litellm, no telemetry, no update checks.
OFFLINE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY_DISABLED": "true",
               "LITELLM_MODE": "PRODUCTION", "LITELLM_LOG": "ERROR", "DISABLE_ADMIN_UI": "True",
               "NO_DOCS": "True", "NO_REDOC": "True"}
START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            # Its own session, so that teardown can stop the proxy's worker processes with it.
            self._proc = subprocess.Popen([str(LITELLM), "--config", str(self.config), "--host", "127.0.0.1",
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
