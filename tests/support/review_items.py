"""The items the review page tests judge and queue (shared by test_review_page, test_review_browser and
test_review_labellers), and a logged-in test client of the page."""

from __future__ import annotations

from repo_paths import ROOT

from optim.review.server import create_review_app, open_reviewing

LAST_SENTENCE = "The lighthouse keeper finally counted forty-two herons at dusk."
LONG = ("The second answer explains at length. " * 80)[:2930] + " " + LAST_SENTENCE
EXAMPLES = ROOT / "data" / "examples"
PAIRS = [
    {"id": "p1", "question": "How do I list files?", "answer_1": "Use this:\n\n```\nls -la\n```\n\n- `-l` long\n- `-a` all",
     "answer_2": LONG, "label": "1"},
    {"id": "p2", "question": "What is 2+2?", "answer_1": "4", "answer_2": "<script>alert(1)</script> five",
     "label": "1"},
    {"id": "p3", "question": "Capital of France?", "answer_1": "Lyon", "answer_2": "Paris", "label": "2"},
    {"id": "p4", "question": "Spell cat backwards", "answer_1": "tac", "answer_2": "tac", "label": "tie"},
]
RAG = [{"id": f"r{i}", "question": f"When does pool {i} open?", "context": f"Pool {i} opens at {6 + i}am.",
        "answer": f"At {6 + i}am."} for i in range(3)]


def client(queue: str, uri: str, reviewer: str | None, *, task=None, secret: str = "s3cret"):
    """A test client of the page over ``queue``, logged in as ``reviewer`` through their own link."""
    from fastapi.testclient import TestClient

    state = open_reviewing(queue, task=task, tracking_uri=uri, token=secret)
    c = TestClient(create_review_app(state))
    if reviewer:
        start = c.get(state.link("http://testserver", reviewer).removeprefix("http://testserver"),
                      follow_redirects=False)
        assert start.status_code == 303, start.text
    return c, state
