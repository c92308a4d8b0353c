"""Long real waits started as soon as the run's tests are known, so that no worker sits idle through them.

A test whose body is one long wait (``dead_endpoint``: four minutes of real timeouts) is named in ``EARLY`` with its
script. The process that schedules the tests (``tests/conftest.py``) starts the script in the background when the
test is selected, and the test waits only for what is left of it. A run that did not start it (the test alone,
under ``-k``) runs the script in the test itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from repo_paths import ROOT

EARLY = {"tests/chateval_dspy/lm/test_breaker.py::"
         "test_with_the_default_settings_a_dead_endpoint_stops_the_run_within_two_call_deadlines": "dead_endpoint"}
WAIT_S = 900  # the script's own bound is 2 call deadlines, 500 s; start-up on a loaded machine comes on top
_running: dict[str, subprocess.Popen] = {}


def start(basetemp: Path, ids: Iterable[str]) -> None:
    """Start, once, the script of each selected test in ``EARLY``; it writes ``<basetemp>/early/<script>.json``."""
    folder = basetemp / "early"
    for script in {EARLY[i] for i in ids if i in EARLY} - set(_running):
        folder.mkdir(exist_ok=True)
        argv, env = _command(script, folder / f"{script}.json")
        with (folder / f"{script}.log").open("w") as log:
            _running[script] = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _command(script: str, out: Path) -> tuple[list[str], dict]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")])
    return [sys.executable, "-m", script, str(out)], {**os.environ, "PYTHONPATH": path}


def stop() -> None:
    """End what is still running (a run stopped early)."""
    for proc in _running.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def result(script: str, basetemp: Path) -> dict:
    """The figures ``script`` wrote: from the early start if this run made one, else from running it here."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    folder = (basetemp.parent if worker else basetemp) / "early"
    out, log = folder / f"{script}.json", folder / f"{script}.log"
    if not log.exists():
        out = basetemp / f"{script}.json"
        argv, env = _command(script, out)
        subprocess.run(argv, env=env, cwd=ROOT, check=True, timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while not out.exists():
        said = log.read_text() if log.exists() else ""
        assert time.monotonic() < deadline and "Traceback" not in said, f"{script} wrote no figures:\n{said[-3000:]}"
        time.sleep(1)
    return json.loads(out.read_text(encoding="utf-8"))
