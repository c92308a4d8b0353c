"""The MLflow UI's Review page shows the queue ``chateval review`` made (issue 14, item 2), in a real browser.

Debian's ``chromium`` (installed by the setup, never downloaded by a test tool) renders the page headless from the
tracking server on loopback, with every network feature that would reach beyond it turned off. The rendered DOM
must hold the queued items' texts and none of the items left out; the focused review of the first item must show
the judged texts and the question reviewers answer. ``CHATEVAL_REVIEW_SCREENSHOT=<path>`` also saves a screenshot
of that page (how ``benchmarks/review-queue.png`` was made).
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow_server import mlflow_db, tracking_server  # noqa: F401 - shared fixtures
from test_review import cli, judged, judged_items, lm_url, on_server, queue_items, queue_named  # noqa: F401

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y "
                                                         "chromium); the setup and CI install it")
# What keeps a headless Chromium on loopback: no sandbox (containers), no GPU, and none of its own network calls.
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--window-size=1500,950"]
# Resolved now: the fixtures move the working directory.
SCREENSHOT = os.environ.get("CHATEVAL_REVIEW_SCREENSHOT") and Path(os.environ["CHATEVAL_REVIEW_SCREENSHOT"]).resolve()
# Virtual time runs the page's scripts and waits for its requests; it is not a wall-clock wait.
BUDGET_MS = 20_000


def render(url: str, profile: Path, *, screenshot: Path | None = None) -> str:
    """The page's DOM after its scripts ran (or, with ``screenshot``, a PNG of it; returns '')."""
    what = [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={BUDGET_MS}",
                           *what, url], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return html.unescape(proc.stdout)


def shown(text: str, page: str) -> bool:
    """Whether an item's text is on the page (the Review page shows a trace's inputs as JSON)."""
    head = text.strip()[:40]
    return head in page or json.dumps(head)[1:-1] in page


def test_the_review_page_lists_the_queued_items_and_shows_their_debate(on_server, tmp_path):  # noqa: F811
    uri, _, results, experiment = on_server
    code, out, err = cli("review", str(results), "--queue", "in-the-browser", "--top", "3", "--reviewer", "alice")
    assert code == 0, err
    url = next(line.removeprefix("review page: ") for line in out.splitlines() if line.startswith("review page: "))
    assert url.startswith(f"{uri}/#/experiments/{experiment}/review-queue?selectedQueueId=")
    found = queue_named(experiment, "in-the-browser")
    assert len(queue_items(found.queue_id)) == 3

    page = render(url, tmp_path / "profile-list")
    assert "in-the-browser" in page and "All (3)" in page
    ids = {line.split("] ")[1].split(":")[0] for line in cli("review", str(results), "--queue", "in-the-browser",
                                                              "--top", "3", "--explain")[1].splitlines()
           if line.startswith("[queued]")}
    assert len(ids) == 3
    for item in judged_items():
        assert shown(item.question, page) == (str(item.id) in ids), item.id

    # The focused review: the first item's texts, and the question with its instruction.
    focused = f"{url}&startReview=true"
    page = render(focused, tmp_path / "profile-review")
    assert "preference" in page and "Which answer is better overall" in page
    assert any(shown(item.question, page) for item in judged_items() if str(item.id) in ids)
    # "View full trace": the debate itself, both answer orders and each referee's turn.
    trace_id = sorted(queue_items(found.queue_id))[0]
    page = render(f"{uri}/#/experiments/{experiment}/traces?selectedEvaluationId={trace_id}", tmp_path / "trace")
    assert all(span in page for span in ("order 1", "order 2 (answers swapped)", "round 1", "critic",
                                         "general_public"))
    png = SCREENSHOT or tmp_path / "review-queue.png"
    render(focused, tmp_path / "profile-shot", screenshot=png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
