"""``chateval review serve``: the review page, a small FastAPI app over an MLflow review queue.

Why a page of our own: MLflow's Review page (3.17) shows a trace's request as one JSON text cut at 1,000
characters (a pairwise item's second answer never shows), puts the panel's verdict under the texts, and stores every
answer of a server without login under the one source ``default``. This page reads the same queue and questions
and writes the same Feedback (``optim.review.desk``), so MLflow's queue, its Review page and ``chateval compile
--labels mlflow:<experiment>`` all see the answers, under each reviewer's own name (``optim.review.reviewers``).

Routes: ``/start?reviewer=&key=`` (a reviewer's link: sets a cookie, then opens the queue), ``/`` (the reviewer's
first unanswered item: resume where you left), ``/item/<trace id>`` (GET the item, POST its answer), ``/health``.
"""

from __future__ import annotations

import html
import secrets
import threading
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote

from fastapi import FastAPI, Request  # resolved from this module's names: the routes' annotations are strings
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from chateval_dspy.errors import DataError
from optim.review import page, reviewers
from optim.review.desk import Desk, check_answer, record_answer

COOKIE = "chateval_review"
MAX_FORM_BYTES = 64_000
# The page's own inline script (by nonce) and inline styles; nothing else may load, be framed or post elsewhere.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-{nonce}'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")


@dataclass
class Reviewing:
    """What the app serves: the queue, the secret its links are keyed with, and where MLflow's UI is."""

    desk: Desk
    secret: str
    ui: str  # MLflow UI base URL, for the link to a debate's trace

    def link(self, base: str, reviewer: str) -> str:
        """A reviewer's personal link to this queue's page."""
        key = reviewers.key_for(self.secret, self.desk.queue_id, reviewer)
        return f"{base.rstrip('/')}/start?reviewer={quote(reviewers.normal(reviewer))}&key={key}"

    def trace_url(self, trace_id: str) -> str:
        return f"{self.ui.rstrip('/')}/#/experiments/{self.desk.experiment_id}/traces?selectedEvaluationId={trace_id}"


def _order_after(trace_ids: list[str], current: str | None) -> list[str]:
    """The queue's items from the one after ``current`` round to the start (all of them when ``current`` is None).

    Example:
        >>> _order_after(["a", "b", "c"], "b"), _order_after(["a", "b"], None)
        (['c', 'a'], ['a', 'b'])
    """
    if current not in trace_ids:
        return list(trace_ids)
    at = trace_ids.index(current)
    return trace_ids[at + 1:] + trace_ids[:at]


def _standing(state: Reviewing, reviewer: str, current: str | None) -> tuple[str, str | None]:
    """(progress line, the next item the reviewer has not answered after ``current``) as MLflow holds them now."""
    desk = state.desk
    answers = desk.answers()
    done = {t for t in desk.trace_ids
            if all(reviewer in answers.get(t, {}).get(q.name, {}) for q in desk.questions)}
    progress = f"{len(done)} of {len(desk.trace_ids)} answered by you"
    following = next((t for t in _order_after(desk.trace_ids, current) if t not in done and t != current), None)
    return progress, following


def _reviewer(request, state: Reviewing) -> tuple[str | None, str | None]:
    """(the reviewer this request comes from, or None; why not)."""
    raw = unquote(request.cookies.get(COOKIE, ""))
    name, _, key = raw.partition(":")
    why = reviewers.refusal(state.secret, state.desk.queue_id, name or None, key or None, state.desk.users)
    return (None, why) if why else (reviewers.normal(name), None)


def _html(body: str, nonce: str, status: int = 200):
    return HTMLResponse(body, status_code=status, headers={
        "Content-Security-Policy": CSP.format(nonce=nonce), "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})


def _refused(why: str):
    nonce = secrets.token_urlsafe(16)
    return _html(f"<!doctype html><meta charset=utf-8><title>review</title><p>{html.escape(why)}</p>", nonce, 403)


def _show(state: Reviewing, reviewer: str, trace_id: str, *, editing: bool = False, message: str | None = None,
          status: int = 200):
    desk = state.desk
    progress, following = _standing(state, reviewer, trace_id)
    item = desk.item(trace_id)
    next_url = f"/item/{following}" if following else None
    body = page.item_body(desk, item, reviewer=reviewer, action=f"/item/{trace_id}", next_url=next_url,
                          trace_url=state.trace_url(trace_id), editing=editing)
    nonce = secrets.token_urlsafe(16)
    return _html(page.page(desk, reviewer, body=body, progress=progress, nonce=nonce, item=item, next_url=next_url,
                           message=message), nonce, status)


def _answers(desk: Desk, body: bytes) -> dict[str, object]:
    """The form's answers, each checked against its question (DataError naming the first bad one)."""
    form = parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=len(desk.questions) + 8)
    return {q.name: check_answer(q, (form.get(q.name) or [None])[-1]) for q in desk.questions}


async def _bounded_body(request) -> bytes | None:
    """The request's body, or None once it passes ``MAX_FORM_BYTES`` (read no further)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def open_reviewing(queue: str, *, experiment: str | None = None, task=None, tracking_uri: str | None = None,
                   token: str | None = None, ui: str | None = None) -> Reviewing:
    """The queue opened for the review page: MLflow pointed at the store, the links' secret (``token`` or a new
    random one), and the MLflow UI the trace links open (default: the tracking server, else ``mlflow ui``'s)."""
    import mlflow

    from optim.review.desk import open_desk
    from optim.tracking import runs as tracking

    uri = tracking.tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    desk = open_desk(queue, experiment=experiment or tracking.EXPERIMENT, task=task)
    base = ui or (uri if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000")
    return Reviewing(desk, token or reviewers.new_secret(), base)


def create_review_app(state: Reviewing):
    """The review page's app over ``state`` (see the module docstring)."""
    app = FastAPI(title="chateval review", openapi_url=None, docs_url=None, redoc_url=None)
    lock = threading.Lock()

    def reload() -> None:
        with lock:
            state.desk.reload()

    @app.get("/health")
    def health():
        return JSONResponse({"status": "ok", "queue": state.desk.name})

    @app.get("/start")
    def start(reviewer: str = "", key: str = ""):
        reload()
        why = reviewers.refusal(state.secret, state.desk.queue_id, reviewer or None, key or None, state.desk.users)
        if why:
            return _refused(why)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, quote(f"{reviewers.normal(reviewer)}:{key}"), httponly=True, samesite="strict")
        return response

    @app.get("/")
    def first(request: Request):
        reload()
        reviewer, why = _reviewer(request, state)
        if why:
            return _refused(why)
        progress, following = _standing(state, reviewer, None)
        if following:
            return RedirectResponse(f"/item/{following}", status_code=303)
        nonce = secrets.token_urlsafe(16)
        body = "<p>Every item of this queue has your answer. Thank you.</p>"
        return _html(page.page(state.desk, reviewer, body=body, progress=progress, nonce=nonce, script=False), nonce)

    _item_routes(app, state, reload)
    return app


def _item_routes(app, state: Reviewing, reload) -> None:
    @app.get("/item/{trace_id}")
    def show(trace_id: str, request: Request, edit: int = 0):
        reload()
        reviewer, why = _reviewer(request, state)
        if why:
            return _refused(why)
        if trace_id not in state.desk.trace_ids:
            return _refused(f"trace {trace_id} is not in review queue '{state.desk.name}'")
        return _show(state, reviewer, trace_id, editing=bool(edit))

    @app.post("/item/{trace_id}")
    async def answer(trace_id: str, request: Request):
        await run_in_threadpool(reload)
        reviewer, why = _reviewer(request, state)
        if why:
            return _refused(why)
        if trace_id not in state.desk.trace_ids:
            return _refused(f"trace {trace_id} is not in review queue '{state.desk.name}'")
        body = await _bounded_body(request)
        if body is None:
            return _refused(f"the form is over {MAX_FORM_BYTES} bytes")
        try:
            values = _answers(state.desk, body)
        except DataError as exc:
            why = str(exc)
            return await run_in_threadpool(lambda: _show(state, reviewer, trace_id, editing=True, message=why,
                                                         status=422))
        await run_in_threadpool(record_answer, state.desk, trace_id, reviewer, values)
        return RedirectResponse(f"/item/{trace_id}", status_code=303)
