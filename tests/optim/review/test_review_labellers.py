"""The review page as labellers and their queue's owner use it.

The quick tests serve the page over a queue held in memory (``FakeDesk``: no MLflow), through FastAPI's test
client: links that work (a name with ``:``, ``--public-url``), the key checked before the queue is read, forms the
page never sends refused, texts drawn as the LM read them, the guidelines, comment and "can't judge" on the page, the
list of items, and the owner's agreement and exports. The slow ones answer, judge-not and withdraw on a real
``mlflow server`` and check what MLflow and the labels reader then hold.
"""

from __future__ import annotations

import csv
import io
import json
import re
from html import unescape

import pytest
from chateval_cli import chateval_captured
from review_items import client

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.task import as_task
from optim.review import server as review_server
from optim.review.desk import CANT_JUDGE, Answer, Desk, ReviewItem
from optim.review.questions import questions
from optim.review.server import Reviewing, create_review_app, public_base

SECRET = "a-test-secret"
PREFERENCE = questions("pairwise")


class FakeDesk(Desk):
    """A queue held in memory: its items, their answers (``found``), and how often it was reloaded."""

    def __init__(self, items: list[ReviewItem], users: list[str], guidelines: str = ""):
        super().__init__("rq-1", "unsure", "1", users, list(PREFERENCE), False, None,
                         trace_ids=[i.trace_id for i in items], guide=as_task("pairwise"), guidelines=guidelines)
        self.items = {i.trace_id: i for i in items}
        self.found: dict[str, dict[str, dict[str, Answer]]] = {}
        self.reloads = 0

    def reload(self) -> None:
        self.reloads += 1

    def overview(self):
        return {t: (self.items[t].item_id, self.found.get(t, {})) for t in self.trace_ids}

    def item(self, trace_id: str) -> ReviewItem:
        return self.items[trace_id]


def words(html: str) -> str:
    """A page's text: tags dropped, entities read, spaces collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def pair_item(trace_id: str, answer_2: str = "Paris", **answers) -> ReviewItem:
    return ReviewItem(trace_id, f"item-{trace_id}", {"question": "Capital of France?"},
                      {"answer_1": "Lyon", "answer_2": answer_2}, {"prediction": "2"}, answers)


def app_for(desk: FakeDesk, reviewer: str | None = None):
    """A test client of the page over ``desk``, signed in as ``reviewer`` through their own link."""
    from fastapi.testclient import TestClient

    state = Reviewing(desk, SECRET, "http://mlflow.example")
    c = TestClient(create_review_app(state))
    if reviewer:
        got = c.get(state.link("http://testserver", reviewer).removeprefix("http://testserver"), follow_redirects=False)
        assert got.status_code == 303, got.text
    return c, state


# ---- links, keys and forms ------------------------------------------------------------------------------

def test_requests_without_a_valid_key_never_read_the_queue_from_mlflow():
    desk = FakeDesk([pair_item("t1")], ["ann"])
    c, state = app_for(desk)
    forged = f"/start?reviewer=ann&key={'0' * 32}"
    for n in range(1000):
        kind = n % 5
        if kind == 0:
            got = c.get("/", follow_redirects=False)
        elif kind == 1:
            c.cookies.set("chateval_review", f"ann:{n:032x}")
            got = c.get("/item/t1")
        elif kind == 2:
            got = c.get(forged, follow_redirects=False)
        elif kind == 3:
            c.cookies.set("chateval_review", "garbage")
            got = c.post("/item/t1", data={"preference": "1"})
        else:
            c.cookies.set("chateval_review_owner", "nope")
            got = c.get("/owner/answers.csv")
        assert got.status_code == 403
        c.cookies.clear()
    assert desk.reloads == 0
    # A reviewer with a valid key does reload the queue (reviewers and items can change while it is served).
    app_for(desk, "ann")[0].get("/item/t1")
    assert desk.reloads >= 1


def test_a_reviewer_name_with_a_colon_gets_a_link_that_works():
    desk = FakeDesk([pair_item("t1")], ["dr:who", "a/b&c"])
    for name in desk.users:
        c, _ = app_for(desk, name)
        first = c.get("/", follow_redirects=False)
        assert first.status_code == 303 and first.headers["location"] == "/item/t1", first.text
        assert f"reviewer <b>{name.replace('&', '&amp;')}</b>" in c.get("/item/t1").text


def test_a_form_with_fields_the_page_never_sends_is_refused_with_400(monkeypatch):
    recorded = []
    monkeypatch.setattr(review_server, "record_answer", lambda *args: recorded.append(args))
    desk = FakeDesk([pair_item("t1")], ["ann"])
    c, _ = app_for(desk, "ann")
    extra = c.post("/item/t1", data={"preference": "1", "admin": "yes"}, follow_redirects=False)
    assert extra.status_code == 400 and "a field 'admin' that this queue's page does not ask" in unescape(extra.text)
    twice = c.post("/item/t1", content="preference=1&preference=2", follow_redirects=False,
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert twice.status_code == 400 and "the field 'preference' twice" in unescape(twice.text)
    many = c.post("/item/t1", content="&".join(f"f{i}=1" for i in range(50)), follow_redirects=False,
                  headers={"content-type": "application/x-www-form-urlencoded"})
    assert many.status_code == 400 and "more than the 3 fields" in many.text
    assert not recorded
    ok = c.post("/item/t1", data={"preference": "1", "comment": " both wrong, Lyon less so "}, follow_redirects=False)
    assert ok.status_code == 303 and recorded[-1][1:] == ("t1", "ann", {"preference": "1"}, "both wrong, Lyon less so")


def test_public_url_is_what_the_links_start_with():
    assert public_base("127.0.0.1", 8100) == "http://127.0.0.1:8100"
    assert public_base("0.0.0.0", 8100, "https://review.example.org/") == "https://review.example.org"
    assert public_base("0.0.0.0", 8100, "http://10.0.0.5:8100") == "http://10.0.0.5:8100"
    wildcard = public_base("0.0.0.0", 8100)
    assert "0.0.0.0" not in wildcard and wildcard.endswith(":8100")  # this machine's name, not the bind address
    for bad in ("review.example.org", "ftp://x", "https://x/review", "https://x/?a=1"):
        with pytest.raises(ConfigError, match="--public-url"):
            public_base("0.0.0.0", 8100, bad)
    _, state = app_for(FakeDesk([pair_item("t1")], ["ann"]))
    assert state.link(public_base("0.0.0.0", 8100, "https://review.example.org"), "ann").startswith(
        "https://review.example.org/start?reviewer=ann&key=")


def test_the_serve_command_refuses_a_bad_public_url_before_reading_mlflow():
    code, out, err = chateval_captured("review", "serve", "--queue", "q", "--host", "0.0.0.0",
                                       "--public-url", "review.example.org",
                                       "--tracking-uri", "http://127.0.0.1:9")  # nothing listens there: it must not be asked
    assert code != 0 and "--public-url 'review.example.org'" in err, out + err


# ---- what labellers see ---------------------------------------------------------------------------------

def test_bidi_controls_are_shown_as_the_lm_read_them_not_applied():
    spoofed = "Open invoice\u202efdp.exe, then \u2066isolated\u2069 and a \u200bhidden space"
    desk = FakeDesk([pair_item("t1", answer_2=spoofed)], ["ann"])
    c, _ = app_for(desk, "ann")
    shown = c.get("/item/t1").text
    assert not [ch for ch in "\u202e\u2066\u2069\u200b" if ch in shown]
    assert "Open invoice⟦U+202E⟧fdp.exe, then ⟦U+2066⟧isolated⟦U+2069⟧ and a ⟦U+200B⟧hidden space" in shown


def test_the_question_speaks_the_tasks_words_not_mlflows():
    (asked,) = questions("pairwise")
    assert "trace" not in asked.instruction and "span" not in asked.instruction
    assert "1 is answer_1 (Assistant 1's answer), 2 is answer_2 (Assistant 2's answer)" in asked.instruction


def test_guidelines_comment_and_cant_judge_are_on_the_page():
    guidelines = "Prefer the **factually right** answer.\n\nExample: *Paris* beats *Lyon* for the capital."
    desk = FakeDesk([pair_item("t1")], ["ann"], guidelines=guidelines)
    c, _ = app_for(desk, "ann")
    shown = c.get("/item/t1").text
    assert "<summary><b>Guidelines</b></summary>" in shown and "<strong>factually right</strong>" in shown
    assert "compare answer_1 and answer_2. What to weigh: overall score of Assistant 1 or 2's answer" in words(shown)
    assert 'name="comment"' in shown and 'name="cant_judge"' in shown and "formnovalidate" in shown


def test_cant_judge_and_comments_are_recorded_and_shown(monkeypatch):
    recorded = []
    monkeypatch.setattr(review_server, "record_answer", lambda *args: recorded.append(args))
    desk = FakeDesk([pair_item("t1"), pair_item("t2", preference={"ann": CANT_JUDGE})], ["ann"])
    desk.items["t2"].comments = {"ann": "Both answers are in Welsh."}
    c, _ = app_for(desk, "ann")
    got = c.post("/item/t1", data={"cant_judge": "1", "comment": "cut off"}, follow_redirects=False)
    assert got.status_code == 303 and recorded[-1][1:] == ("t1", "ann", None, "cut off")
    shown = c.get("/item/t2").text
    assert "Your answer: can't judge · your comment: Both answers are in Welsh." in words(shown)
    assert "withdraw my answer" in shown and 'action="/item/t2/withdraw"' in shown


def test_withdrawing_an_answer(monkeypatch):
    withdrawn = []
    monkeypatch.setattr(review_server, "withdraw_answer", lambda *args: withdrawn.append(args[1:]) or 1)
    desk = FakeDesk([pair_item("t1", preference={"ann": "2"})], ["ann", "bo"])
    ann, _ = app_for(desk, "ann")
    got = ann.post("/item/t1/withdraw", follow_redirects=False)
    assert got.status_code == 303 and got.headers["location"] == "/item/t1" and withdrawn == [("t1", "ann")]
    assert app_for(desk)[0].post("/item/t1/withdraw").status_code == 403 and len(withdrawn) == 1


def test_the_list_of_items_to_jump_to():
    desk = FakeDesk([pair_item("t1"), pair_item("t2"), pair_item("t3")], ["ann"])
    desk.found = {"t1": {"preference": {"ann": Answer("2")}}, "t3": {"preference": {"ann": Answer(CANT_JUDGE)}}}
    c, _ = app_for(desk, "ann")
    shown = unescape(c.get("/items").text)
    rows = [" ".join(r.split()) for r in shown.split("<tr>")[2:]]
    assert ['<td>1</td><td><a href="/item/t1">item-t1</a> </td><td>preference: 2</td></tr>' in rows[0],
            "item-t2" in rows[1] and "not answered" in rows[1], "can't judge" in rows[2]] == [True] * 3
    assert 'href="/items"' in c.get("/item/t1").text


def owner_client(desk: FakeDesk):
    c, state = app_for(desk)
    got = c.get(state.owner_link("http://testserver").removeprefix("http://testserver"), follow_redirects=False)
    assert got.status_code == 303
    return c


def test_the_owner_sees_agreement_with_its_counts_and_exports_the_answers():
    items = [pair_item(f"t{i}") for i in range(4)]
    desk = FakeDesk(items, ["ann", "bo"])
    said = {"t0": ("1", "1"), "t1": ("2", "2"), "t2": ("tie", "2"), "t3": ("1", CANT_JUDGE)}
    desk.found = {t: {"preference": {"ann": Answer(a, "", 1_700_000_000_000), "bo": Answer(b, "=cmd|' /C calc'!A0")}}
                  for t, (a, b) in said.items()}
    # Only the owner's link opens it: a reviewer's does not.
    assert app_for(desk, "ann")[0].get("/owner").status_code == 403
    c = owner_client(desk)
    shown = words(c.get("/owner").text)
    assert "Krippendorff's alpha" in shown
    # The 3 pairable items (1,1), (2,2), (tie,2), nominal: D_o = 2/6, D_e = 2 (2*3 + 2*1 + 3*1) / (6*5) = 22/30,
    # alpha = 1 - (1/3) / (22/30) = 6/11; t3's "can't judge" leaves one answer, not pairable.
    assert "preference 0.545 nominal 3 6 2 1" in shown and "bo 4 of 4 1" in shown
    rows = [json.loads(line) for line in c.get("/owner/answers.jsonl").text.splitlines()]
    assert len(rows) == 8 and rows[0] == {"item_id": "item-t0", "trace_id": "t0", "question": "preference",
                                          "reviewer": "ann", "answer": "1", "comment": "",
                                          "answered_at": "2023-11-14T22:13:20+00:00"}
    assert rows[-1]["answer"] == CANT_JUDGE
    table = list(csv.DictReader(io.StringIO(c.get("/owner/answers.csv").text)))
    assert len(table) == 8 and table[1]["comment"] == "'=cmd|' /C calc'!A0"  # never a formula in a spreadsheet


# ---- on a real mlflow server ------------------------------------------------------------------------------------

def test_comment_cant_judge_and_withdraw_as_mlflow_and_the_labels_reader_hold_them(queued):
    import mlflow
    from mlflow.genai.review_queues import list_review_queue_items

    from chateval_dspy.deploy.mlflow.trace_labels import human_answers

    uri, _, _ = queued
    ann, state = client("pairs", uri, "ann")
    bo, _ = client("pairs", uri, "bo")
    trace_id = state.desk.trace_ids[0]

    def held():
        mlflow.flush_trace_async_logging()
        trace = mlflow.get_trace(trace_id)
        status = {i.item_id: str(i.status).lower() for i in list_review_queue_items(state.desk.queue_id)}[trace_id]
        mine = [(a.source.source_id, a.value, getattr(a.error, "error_code", None), a.rationale)
                for a in trace.info.assessments if a.name == "preference"]
        return sorted(mine, key=str), human_answers(trace), status.rsplit(".", 1)[-1]

    assert ann.post(f"/item/{trace_id}", data={"preference": "2", "comment": "2 cites its source"},
                    follow_redirects=False).status_code == 303
    assert bo.post(f"/item/{trace_id}", data={"cant_judge": "1", "comment": "not a language I read"},
                   follow_redirects=False).status_code == 303
    feedback, labels, status = held()
    assert feedback == [("ann", "2", None, "2 cites its source"), ("bo", None, "CANT_JUDGE", "not a language I read")]
    assert labels == {"preference": {"ann": "2"}} and status == "complete"  # never read as a label; bo did answer
    assert "Your answer: can't judge · your comment: not a language I read" in words(bo.get(f"/item/{trace_id}").text)
    # bo answers after all: the answer replaces "can't judge" (labels read what bo says now)
    assert bo.post(f"/item/{trace_id}", data={"preference": "1"}, follow_redirects=False).status_code == 303
    feedback, labels, _ = held()
    assert [f[:3] for f in feedback] == [("ann", "2", None), ("bo", "1", None)] and labels["preference"]["bo"] == "1"
    # ann withdraws hers: gone from MLflow, the item pending again, and the page asks her again
    assert ann.post(f"/item/{trace_id}/withdraw", follow_redirects=False).status_code == 303
    feedback, labels, status = held()
    assert [f[0] for f in feedback] == ["bo"] and labels == {"preference": {"bo": "1"}} and status == "pending"
    assert 'id="answer"' in ann.get(f"/item/{trace_id}").text
    # the owner's export holds what MLflow holds
    owner, _ = client("pairs", uri, None)
    assert owner.get(state.owner_link("http://testserver").removeprefix("http://testserver"),
                     follow_redirects=False).status_code == 303
    rows = [json.loads(line) for line in owner.get("/owner/answers.jsonl").text.splitlines()]
    assert [(r["reviewer"], r["answer"]) for r in rows if r["trace_id"] == trace_id] == [("bo", "1")]
