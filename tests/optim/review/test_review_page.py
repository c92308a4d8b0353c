"""The review page (``chateval review serve``): the whole item, blind to the panel, each answer under the reviewer's
own name, against a real ``mlflow server``.

Four pairwise items (one of them with a 3,000-character second answer ending in a sentence found nowhere else, one
with Markdown) and three RAG items (a pass/fail and a 1-5 question) are judged with traces on a fake LM and queued
by ``chateval review`` for two reviewers; the page is then driven through FastAPI's test client. The browser test
(``test_review_browser.py``) drives the same page with the keyboard in Chromium.
"""

from __future__ import annotations

import re
from html import unescape

import pytest
from chateval_cli import chateval_captured
from review_items import EXAMPLES, LAST_SENTENCE, LONG, client

from optim.review import reviewers


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.mark.slow
def test_the_whole_item_is_on_the_page_rendered_and_blind(queued):
    uri, _, _ = queued
    c, state = client("pairs", uri, "ann")
    long_item = next(t for t in state.desk.trace_ids if state.desk.item(t).item_id == "p1")
    got = c.get(f"/item/{long_item}")
    assert got.status_code == 200
    assert LAST_SENTENCE in got.text and LONG.split(" ")[3] in got.text
    assert "<pre><code>ls -la" in got.text and "<li><code>-l</code> long</li>" in got.text  # Markdown rendered
    assert "How do I list files?" in got.text and "Answer 1" in got.text and "Answer 2" in got.text
    assert 'class="pair"' in got.text  # the two answers side by side
    # Blind: nothing of the panel's verdict before answering.
    page_text = text_of(got.text).lower()  # (the guidelines name the task's criteria, "overall score" among them)
    assert "verdict" not in page_text and "(scores" not in page_text and not re.search(r"answer [12] is better|a tie",
                                                                                        page_text)
    csp = got.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'nonce-" in csp


def test_a_judged_text_cannot_inject_markup(queued):
    uri, _, _ = queued
    c, state = client("pairs", uri, "ann")
    hostile = next(t for t in state.desk.trace_ids if state.desk.item(t).item_id == "p2")
    got = c.get(f"/item/{hostile}").text
    assert "<script>alert(1)</script>" not in got and "&lt;script&gt;alert(1)&lt;/script&gt; five" in got


def test_two_reviewers_answers_stay_two_under_their_own_names(queued):
    import mlflow

    uri, _, _ = queued
    ann, state = client("pairs", uri, "ann")
    bo, _ = client("pairs", uri, "bo")
    first = state.desk.trace_ids[0]
    assert ann.get("/", follow_redirects=False).headers["location"] == f"/item/{first}"
    assert ann.post(f"/item/{first}", data={"preference": "2"}, follow_redirects=False).status_code == 303
    assert bo.post(f"/item/{first}", data={"preference": "tie"}, follow_redirects=False).status_code == 303
    mlflow.flush_trace_async_logging()
    kept = [(a.source.source_id, a.value, str(a.source.source_type)) for a in
            mlflow.get_trace(first).info.assessments if a.name == "preference"]
    assert sorted(kept)[:2] == [("ann", "2", "HUMAN"), ("bo", "tie", "HUMAN")]
    # After answering: the reviewer's answer, the panel's verdict, and the debate in MLflow.
    shown = ann.get(f"/item/{first}").text
    assert "Your answer:" in shown and "preference: 2" in shown and "The panel's verdict:" in shown
    assert f"{uri}/#/experiments/{state.desk.experiment_id}/traces?selectedEvaluationId={first}" in shown
    # Resume where you left: ann's next unanswered item, and her progress.
    assert ann.get("/", follow_redirects=False).headers["location"] == f"/item/{state.desk.trace_ids[1]}"
    assert "1 of 4 answered by you" in ann.get(f"/item/{state.desk.trace_ids[1]}").text
    from mlflow.genai.review_queues import list_review_queue_items

    status = {i.item_id: i.status for i in list_review_queue_items(state.desk.queue_id)}
    assert str(status[first]).lower().endswith("complete")  # both assigned reviewers answered


def test_a_wrong_key_or_an_unassigned_reviewer_is_refused(queued):
    uri, _, _ = queued
    c, state = client("pairs", uri, None)
    assert c.get("/", follow_redirects=False).status_code == 403
    forged = f"/start?reviewer=ann&key={reviewers.key_for('another secret', state.desk.queue_id, 'ann')}"
    assert c.get(forged, follow_redirects=False).status_code == 403
    carol = c.get(state.link("http://testserver", "carol").removeprefix("http://testserver"), follow_redirects=False)
    assert carol.status_code == 403 and "'carol' is not assigned to this queue (its reviewers: ann, bo)" in unescape(carol.text)
    assert c.post(f"/item/{state.desk.trace_ids[0]}", data={"preference": "1"}).status_code == 403


def test_a_bad_answer_is_refused_with_the_question_named(queued):
    import mlflow

    uri, _, _ = queued
    c, state = client("pairs", uri, "ann")
    trace_id = state.desk.trace_ids[2]
    got = c.post(f"/item/{trace_id}", data={"preference": "3"})
    assert got.status_code == 422 and "'preference': answer one of 1, 2, tie" in unescape(got.text)
    assert not [a for a in mlflow.get_trace(trace_id).info.assessments or [] if a.name == "preference"
                and a.source.source_id == "ann"]


def test_a_pointwise_queue_asks_each_criterion_on_its_scale(queued):
    import mlflow

    uri, _, _ = queued
    c, state = client("rag", uri, "bo", task=str(EXAMPLES / "rag.yaml"))
    assert [q.name for q in state.desk.questions] == ["faithful", "relevance"]
    trace_id = state.desk.trace_ids[0]
    page = c.get(f"/item/{trace_id}").text
    for value, key in (("pass", "1"), ("fail", "2"), *((str(v), str(v)) for v in range(1, 6))):
        assert f'value="{value}" data-key="{key}"' in page
    assert "Context" in page and "Answer" in page and 'class="pair"' not in page
    assert c.post(f"/item/{trace_id}", data={"faithful": "fail", "relevance": "4"},
                  follow_redirects=False).status_code == 303
    got = {a.name: a.value for a in mlflow.get_trace(trace_id).info.assessments if a.source.source_id == "bo"}
    assert got == {"faithful": "fail", "relevance": 4}


def test_a_queue_made_with_show_panel_shows_the_verdict_first_and_says_so(queued):
    uri, _, work = queued

    def review(*flag):
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(work)
            mp.setenv("MLFLOW_TRACKING_URI", uri)
            code, out, err = chateval_captured("review", "pairs.jsonl.out", "--queue", "pairs", "--top", "4", *flag)
        assert code == 0 and "0 added" in out, out + err

    review("--show-panel")
    try:
        _, state = client("pairs", uri, None)
        assert state.desk.show_panel
        c, state = client("pairs", uri, "bo")
        unanswered = next(t for t in state.desk.trace_ids if not state.desk.item(t).answers)
        page = text_of(c.get(f"/item/{unanswered}").text)
        assert "This queue shows the panel's verdict before you answer" in page and "The panel's verdict:" in page
        assert "Your answer:" not in page
    finally:
        review("--no-show-panel")
    c, state = client("pairs", uri, "bo")
    assert not state.desk.show_panel and "The panel's verdict:" not in c.get(f"/item/{unanswered}").text
