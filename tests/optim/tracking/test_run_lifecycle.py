"""A command's MLflow run exists from the start, RUNNING while it judges, and ends FINISHED,
FAILED or KILLED; MLflow's own "View run" lines stay out of the commands' output.

Against a real ``mlflow server``: ``chateval evaluate`` runs as a process on a slow fake OpenAI-compatible server
while the test watches its run on the server, then stops it with SIGTERM, SIGINT or SIGKILL mid-judging (the three
at once, to keep the test short). A SIGKILL cannot be caught: its run stays RUNNING until the same command is rerun.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ablation_panel import BAD, GOOD, PARTLY  # the scripted panel (its fixture: tests/optim/conftest.py)

from chateval_dspy.testing.fake_lm import default_responder
from chateval_dspy.testing.fake_server import FakeOpenAIServer

ITEMS = 20


class Clocked(FakeOpenAIServer):
    """The fake server, answering after ``delay`` seconds and noting when each chat request came."""

    def __init__(self, delay: float = 0.0):
        self.times: list[float] = []
        self.delay = delay
        lock = threading.Lock()

        def respond(call):
            with lock:
                self.times.append(time.time())
            time.sleep(self.delay)
            return default_responder(call)
        super().__init__(responder=respond)


def evaluate_args(url: str, out: Path, uri: str, *extra: str) -> list[str]:
    return ["evaluate", "--dataset", "faireval", "--limit", str(ITEMS), "--roles", "1", "--turns", "1", "--model", url,
            "--no-cache", "--no-progress", "--no-trace", "--tracking-uri", uri, "--out", str(out), *extra]


def spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPENAI_API_KEY")}
    # A shell starts background jobs (CI's `nohup ... &`) with SIGINT ignored, and the child would inherit that:
    # give it the default, as a terminal's foreground command has, so that Ctrl-C is what the test sends.
    return subprocess.Popen([sys.executable, "-m", "optim.cli.main", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def runs_of(client, out: Path) -> list:
    """The evaluate runs of results file ``out``, oldest first."""
    experiment = client.get_experiment_by_name("chateval-dspy")
    if experiment is None:
        return []
    found = client.search_runs([experiment.experiment_id], f"tags.`chateval.out` = '{out.resolve()}'")
    return sorted(found, key=lambda r: r.info.start_time)


def lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


@pytest.fixture
def client(tracking_server, tmp_path, monkeypatch):
    """A client of the server; commands run in this process log there too, and the test's URI is put back."""
    import mlflow

    uri, _ = tracking_server
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    previous = mlflow.get_tracking_uri()
    yield mlflow.MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(previous)


@pytest.mark.slow
def test_evaluate_runs_while_it_judges_and_ends_killed_by_sigterm_or_sigint_and_after_sigkill(client, tmp_path):
    from optim.cli.main import main

    uri = client.tracking_uri
    with contextlib.ExitStack() as stack:
        jobs, urls = {}, {}
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
            server = Clocked(delay=0.3)
            out, urls[sig] = tmp_path / f"{sig.name}.jsonl", stack.enter_context(server)
            jobs[sig] = (spawn(evaluate_args(urls[sig], out, uri), tmp_path), out, server)
        seen = _stop_each_mid_judging(client, jobs)
        _check_stopped(client, jobs, seen)
        # Rerun, the SIGKILLed command resumes its file and ends the run it left as KILLED; its own run finishes.
        _, out, server = jobs[signal.SIGKILL]
        server.delay, server.times[:] = 0.0, []
        assert main(evaluate_args(urls[signal.SIGKILL], out, uri)) == 0
    killed, finished = runs_of(client, out)
    assert (killed.info.status, finished.info.status) == ("KILLED", "FINISHED") and lines(out) == ITEMS
    assert finished.info.start_time <= server.times[0] * 1000 and finished.info.end_time >= int(server.times[-1] * 1000)
    assert finished.data.metrics["accuracy"] >= 0 and finished.data.params["model"] == "openai-compatible/fake-served"


def _check_stopped(client, jobs: dict, seen: dict) -> None:
    """Each run as it was seen RUNNING, and as it ended: KILLED by SIGTERM or SIGINT, left RUNNING by SIGKILL."""
    for sig, (proc, out, server) in jobs.items():
        running = seen[sig]
        # Created before its first LM call; the panel, data and model are there while it runs.
        assert running.info.start_time <= server.times[0] * 1000
        assert running.data.params["config.roles"] == "general_public" and len(running.data.params["dataset_hash"]) == 16
        assert running.data.params["model"] == "openai-compatible/fake-served"
        assert running.data.tags["command"] == "evaluate" and "accuracy" not in running.data.metrics
        stdout, stderr = proc.communicate(timeout=120)
        assert 0 < lines(out) < ITEMS  # finished items kept, the rest never judged
        (ended,) = runs_of(client, out)
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL and ended.info.status == "RUNNING"  # nothing could end it
            continue
        assert proc.returncode == 128 + sig, stdout + stderr
        assert ("terminated" if sig == signal.SIGTERM else "interrupted") in stderr
        assert ended.info.status == "KILLED" and ended.info.end_time >= int(server.times[-1] * 1000)


def _stop_each_mid_judging(client, jobs: dict) -> dict:
    """Signal each process once its run is RUNNING and an item is judged; returns each run as it was seen then."""
    seen, deadline = {}, time.monotonic() + 120
    while len(seen) < len(jobs):
        assert time.monotonic() < deadline, "no run seen RUNNING in time"
        for sig, (proc, out, _) in jobs.items():
            if sig in seen:
                continue
            if proc.poll() is not None:
                pytest.fail(f"{sig.name}: the command ended before it was stopped\n{proc.communicate()}")
            found = runs_of(client, out)
            if found and lines(out) >= 1:
                assert [r.info.status for r in found] == ["RUNNING"]
                seen[sig] = found[0]
                proc.send_signal(sig)
        time.sleep(0.2)
    return seen


@pytest.mark.slow
def test_evaluate_that_fails_ends_failed_and_no_mlflow_makes_no_run(client, tmp_path):
    from optim.cli.main import main

    uri = client.tracking_uri

    def evaluate_runs() -> dict:
        experiment = client.get_experiment_by_name("chateval-dspy").experiment_id
        return {r.info.run_id: r for r in client.search_runs([experiment], "tags.command = 'evaluate'")}

    with Clocked() as url:  # the experiment exists from here on
        assert main(evaluate_args(url, tmp_path / "first.jsonl", uri, "--limit", "1")) == 0
    before = evaluate_runs()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    assert main(evaluate_args(nowhere, tmp_path / "failed.jsonl", uri)) == 2  # the LM server cannot be reached
    (failed,) = [r for run_id, r in evaluate_runs().items() if run_id not in before]
    assert failed.info.status == "FAILED" and failed.data.params["config.roles"] == "general_public"
    before = evaluate_runs()
    with Clocked() as url:
        assert main(evaluate_args(url, tmp_path / "untracked.jsonl", uri, "--no-mlflow")) == 0
    assert evaluate_runs().keys() == before.keys()


@pytest.mark.slow
def test_ablate_prints_a_line_per_variant_and_no_mlflow_links(client, scripted, tmp_path, capsys):
    from optim.cli.main import main

    code = main(["ablate", "--dataset", "faireval", "--split", "test", "--limit", "10", "--role", GOOD, "--role",
                 PARTLY, "--role", BAD, "--turns", "1", "--no-calibrate", "--out", str(tmp_path / "a"),
                 "--no-progress", "--tracking-uri", client.tracking_uri])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "View run" not in out + err and "View experiment" not in out + err
    assert "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT" not in os.environ  # switched on only while runs were open
    headers = [line for line in err.splitlines() if line.startswith(("full panel:", "without ", f"{GOOD} alone:",
                                                                    f"{PARTLY} alone:", f"{BAD} alone:"))]
    assert len(headers) == 7, err
    parent_id = next(line.split()[-1] for line in out.splitlines() if line.startswith("mlflow run:"))
    parent = client.get_run(parent_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"] * 7
    assert parent.info.start_time <= min(c.info.start_time for c in children)
