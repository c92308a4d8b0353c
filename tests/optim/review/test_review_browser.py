"""The review page in a real browser: ``chateval review serve`` over a real ``mlflow server``, driven by Debian's
headless Chromium with the keyboard alone (``tests/support/browser.py`` speaks the DevTools protocol; no browser is
downloaded).

A queued pairwise item whose second answer is 3,000 characters must show that answer's last sentence (in the DOM,
and drawn in the screenshot); nothing of the panel's verdict is on the page before answering; two reviewers answer
with keys, two Feedback land under their own names, and ``chateval compile --labels mlflow:...`` counts two
reviewers. At 1,400 px a 5,000-character string and a long URL wrap (the page no wider than the window, the two
answers apart) and a right-to-left override shows as a marker. ``CHATEVAL_REVIEW_SCREENSHOTS=<dir>`` keeps the
screenshots (how the README's were made).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser import Browser, find_chromium
from chateval_cli import chateval_captured
from local_http import free_port
from review_items import EXAMPLES, LAST_SENTENCE

from chateval_dspy.testing.fake_server import FakeOpenAIServer

pytestmark = [pytest.mark.slow,  # a real browser (Debian's chromium)
              pytest.mark.skipif(find_chromium() is None, reason="Debian's chromium is not installed (apt-get "
                                                                "install -y chromium, as docs/contributing.md says; CI does)")]
SHOTS = os.environ.get("CHATEVAL_REVIEW_SCREENSHOTS") and Path(os.environ["CHATEVAL_REVIEW_SCREENSHOTS"]).resolve()
# Verdict words the page must not hold before the reviewer answers.
BLIND = ("verdict", "panel said", "score_1", "score_2", "winner", "consistent")


def serve(queue: str, uri: str, work: Path, *extra: str):
    """``chateval review serve`` as a user starts it: (process, {reviewer: link}, base URL)."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "CHATEVAL_REVIEW_TOKEN": "a-long-review-secret-for-tests"}
    proc = subprocess.Popen([sys.executable, "-m", "optim.cli", "review", "serve", "--queue", queue, "--port",
                             str(port), *extra], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    links, base = {}, f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("  ") and ": http" in line:
            who, link = line.strip().split(": ", 1)
            links[who] = link
        if line.startswith("Ctrl-C"):
            break
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2):  # noqa: S310 - loopback
                return proc, links, base
        except OSError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail(f"review serve did not start: {proc.stdout.read()[-2000:]}")


def stop(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def answer_with_keys(browser: Browser, *keys: str) -> None:
    for key in keys:
        with browser.expect_load() if key == keys[-1] else _nothing():
            browser.press(key)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def drawn(png: Path, box: dict) -> bool:
    """Whether text is drawn in ``box`` of the screenshot (dark pixels on the light page)."""
    from PIL import Image

    with Image.open(png) as image:
        crop = image.convert("L").crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]),
                                        int(box["y"] + box["height"])))
        return crop.size[0] > 50 and crop.getextrema()[0] < 100


SENTENCE_BOX = f"""(() => {{
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {{
    const at = n.data.indexOf({LAST_SENTENCE!r});
    if (at < 0) continue;
    const r = document.createRange(); r.setStart(n, at); r.setEnd(n, at + {len(LAST_SENTENCE)});
    const b = r.getBoundingClientRect();
    return {{x: b.x + scrollX, y: b.y + scrollY, width: b.width, height: b.height}};
  }}
  return null;
}})()"""


def test_two_reviewers_answer_the_whole_item_blind_with_the_keyboard(queued, tmp_path):
    import mlflow

    uri, _, work = queued
    proc, links, base = serve("pairs", uri, work)
    try:
        assert set(links) == {"ann", "bo"}
        shots = SHOTS or tmp_path
        shots.mkdir(parents=True, exist_ok=True)
        long_trace = next(t.info.trace_id for t in mlflow.search_traces(return_type="list", include_spans=False,
                                                                        locations=[queued[1]])
                          if t.info.tags.get("chateval.item_id") == "p1")
        with Browser(tmp_path / "ann", width=1400, height=1000) as ann:
            ann.open(links["ann"])  # the link sets ann's cookie and opens her first item
            assert "/item/" in ann.url() and "0 of 4 answered by you" in ann.text()
            ann.open(f"{base}/item/{long_trace}")
            text = ann.text()
            assert LAST_SENTENCE in text and "How do I list files?" in text
            assert not [w for w in BLIND if w in text.lower()], text[:3000]
            png = ann.screenshot(shots / "review-pairwise.png")
            box = ann.evaluate(SENTENCE_BOX)
            assert box and box["width"] > 0 and drawn(png, box)
            answer_with_keys(ann, "2")
            ann.wait_for(lambda: "Your answer:" in ann.text())
            assert "The panel's verdict:" in ann.text() and "the full debate in MLflow" in ann.text()
            with ann.expect_load():
                ann.press("n")
            assert "1 of 4 answered by you" in ann.text()
        with Browser(tmp_path / "bo", width=1400, height=1000) as bo:
            bo.open(links["bo"])
            bo.open(f"{base}/item/{long_trace}")
            answer_with_keys(bo, "2")
            bo.wait_for(lambda: "Your answer:" in bo.text())
    finally:
        stop(proc)
    mlflow.flush_trace_async_logging()
    got = sorted((a.source.source_id, a.value) for a in mlflow.get_trace(long_trace).info.assessments
                 if a.name == "preference")
    assert got == [("ann", "2"), ("bo", "2")]
    with FakeOpenAIServer() as lm:
        code, out, err = chateval_captured("compile", "--dataset", "faireval", "--limit", "2", "--labels", "mlflow:chateval-dspy",
                                           "--roles", "2", "--turns", "1", "--model", lm, "--no-cache", "--optimizer", "labeled",
                                           "--no-progress", "--no-log-model", "--out", str(tmp_path / "program"))
    assert code == 0, out + err
    labels = json.loads((tmp_path / "program" / "card.json").read_text())["labels"]
    assert labels["reviewers"] == {"ann": 1, "bo": 1} and long_trace in labels["traces"]


def test_a_pointwise_queue_is_answered_with_digits(queued, tmp_path):
    import mlflow

    uri, _, work = queued
    proc, links, base = serve("rag", uri, work, "--task", str(EXAMPLES / "rag.yaml"))
    try:
        with Browser(tmp_path / "bo", width=1400, height=900) as bo:
            bo.open(links["bo"])
            trace_id = bo.url().rsplit("/", 1)[-1]
            text = bo.text()
            assert "Question" in text and "Context" in text and "Answer" in text
            png = bo.screenshot((SHOTS or tmp_path) / "review-pointwise.png")
            assert png.stat().st_size > 1000
            answer_with_keys(bo, "2", "4")  # faithful: fail (its second label), relevance: 4
            bo.wait_for(lambda: "Your answer:" in bo.text())
    finally:
        stop(proc)
    got = {a.name: a.value for a in mlflow.get_trace(trace_id).info.assessments if a.source.source_id == "bo"}
    assert got == {"faithful": "fail", "relevance": 4}


LONG_URL = "https://files.example.org/download?" + "&".join(f"part{i}=a1b2c3d4e5" for i in range(330))
UNBROKEN = "x" * 5000
SPOOFED = "Open invoice\u202efdp.exe"
LAYOUT = """(() => {
  const boxes = [...document.querySelectorAll('.judged')].map(e => {
    const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, scroll: e.scrollWidth, client: e.clientWidth};
  });
  return {page: document.documentElement.scrollWidth, viewport: window.innerWidth, boxes};
})()"""


def test_long_unbroken_strings_wrap_and_bidi_controls_show_as_read(queued, tmp_path):
    """At 1,400 px: a 5,000-character string and a long URL wrap (the page no wider than the window, answer 1's
    box and text left of answer 2's), and a right-to-left override is shown as a marker, not applied."""
    uri, _, work = queued
    row = {"id": "wide", "question": f"Is this link safe? {LONG_URL}", "answer_1": f"{UNBROKEN} {SPOOFED}",
           "answer_2": f"No: {LONG_URL} is not the bank's.", "label": "2"}
    (work / "wide.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.MonkeyPatch.context() as mp, FakeOpenAIServer() as lm:
        mp.chdir(work)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        for argv in (("evaluate", "--format", "pairwise", "--dataset", "wide.jsonl", "--out", "wide.out", "--roles", "2",
                      "--turns", "1", "--model", lm, "--no-cache", "--trace", "--no-progress"),
                     ("review", "wide.out", "--queue", "wide", "--top", "1", "--reviewer", "ann")):
            code, out, err = chateval_captured(*argv)
            assert code == 0, out + err
    proc, links, _ = serve("wide", uri, work)
    try:
        with Browser(tmp_path / "ann", width=1400, height=1000) as ann:
            ann.open(links["ann"])
            layout = ann.evaluate(LAYOUT)
            ann.screenshot((SHOTS or tmp_path) / "review-wide.png")
            text = ann.text()
    finally:
        stop(proc)
    assert layout["page"] <= layout["viewport"], layout
    first, second = layout["boxes"]
    assert first["right"] <= second["left"] and first["top"] == second["top"], layout  # side by side, apart
    assert all(b["scroll"] <= b["client"] for b in layout["boxes"]), layout  # no text drawn outside its box
    assert "Open invoice\u27e6U+202E\u27e7fdp.exe" in text and "\u202e" not in text
    assert UNBROKEN[:100] in text.replace("\n", "")
