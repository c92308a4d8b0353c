"""``chateval review serve``: the review page, a small FastAPI app over an MLflow review queue.

Why a page of our own: MLflow's Review page (3.17) shows a trace's request as one JSON text cut at 1,000
characters (a pairwise item's second answer never shows), puts the panel's verdict under the texts, and stores every
answer of a server without login under the one source ``default``. This page reads the same queue and questions
and writes the same Feedback (``optim.review.desk``), so MLflow's queue, its Review page and ``chateval compile
--labels mlflow:<experiment>`` all see the answers, under each reviewer's own name (``optim.review.reviewers``).

Routes: ``/start?reviewer=&key=`` (a reviewer's link: sets a cookie, then opens the queue), ``/`` (the reviewer's
first unanswered item: resume where you left), ``/items`` (every item, to jump to), ``/item/<trace id>`` (GET the
item, POST its answer or "can't judge"), ``/item/<trace id>/withdraw`` (POST), ``/owner/start?key=`` (the queue
owner's link), ``/owner`` (agreement among the reviewers), ``/owner/answers.jsonl`` and ``/owner/answers.csv``
(export), ``/health``.

Every request's key is checked before anything is read from MLflow, so requests without a valid key cost no
tracking-server call; a form with a field no question asks is refused (400) rather than guessed at.
"""

from __future__ import annotations

import html
import secrets
import threading
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from fastapi import FastAPI, Request  # resolved from this module's names: the routes' annotations are strings
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from chateval_dspy.errors import ConfigError, DataError
from optim.review import page, reviewers
from optim.review.agreement import agreement
from optim.review.desk import CANT_JUDGE, Desk, check_answer, record_answer, withdraw_answer
from optim.review.export import answer_rows, as_csv, as_jsonl

COOKIE = "chateval_review"
OWNER_COOKIE = "chateval_review_owner"
MAX_FORM_BYTES = 64_000
FORM_FIELDS = ("comment", "cant_judge")  # the form's fields besides the questions
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
MAX_GUIDELINES_BYTES = 100_000
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
        return f"{base.rstrip('/')}/start?reviewer={quote(reviewers.normal(reviewer), safe='')}&key={key}"

    def owner_link(self, base: str) -> str:
        """The queue owner's link: agreement among the reviewers and the exports."""
        return f"{base.rstrip('/')}/owner/start?key={reviewers.owner_key(self.secret, self.desk.queue_id)}"

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


def public_base(host: str, port: int, public_url: str | None = None) -> str:
    """The address the printed links start with: ``public_url`` (where reviewers reach the server), else the
    bound address; a wildcard bind (``0.0.0.0``) names no host a reviewer can open, so this machine's name stands in.

    Example:
        >>> public_base("127.0.0.1", 8100), public_base("0.0.0.0", 8100, "https://review.example.org/")
        ('http://127.0.0.1:8100', 'https://review.example.org')
    """
    if public_url:
        given = urlsplit(public_url.strip())
        if given.scheme not in ("http", "https") or not given.netloc or given.path.strip("/") or given.query \
                or given.fragment:
            raise ConfigError(f"--public-url {public_url!r}: give the address reviewers open, scheme, host and "
                              "port only (e.g. https://review.example.org or http://10.0.0.5:8100)")
        return f"{given.scheme}://{given.netloc}"
    if host in WILDCARD_HOSTS:
        import socket

        host = socket.getfqdn()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _keyed(request, state: Reviewing) -> tuple[str | None, str | None]:
    """(the reviewer whose valid key this request carries, or None; why not), from the cookie alone: no MLflow."""
    raw = unquote(request.cookies.get(COOKIE, ""))
    name, _, key = raw.rpartition(":")  # the key is hex: the last ':' ends the name, whatever the name holds
    if not reviewers.key_matches(state.secret, state.desk.queue_id, name or None, key or None):
        return None, reviewers.INVALID
    return reviewers.normal(name), None


def _assigned(state: Reviewing, reviewer: str) -> str | None:
    """Why a keyed reviewer may not answer (no longer assigned), or None; after the queue was reloaded."""
    key = reviewers.key_for(state.secret, state.desk.queue_id, reviewer)
    return reviewers.refusal(state.secret, state.desk.queue_id, reviewer, key, state.desk.users)


def _owner(request, state: Reviewing) -> bool:
    key = request.cookies.get(OWNER_COOKIE, "")
    return reviewers.owner_matches(state.secret, state.desk.queue_id, key)


def _html(body: str, nonce: str, status: int = 200):
    return HTMLResponse(body, status_code=status, headers={
        "Content-Security-Policy": CSP.format(nonce=nonce), "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})


def _refused(why: str, status: int = 403):
    nonce = secrets.token_urlsafe(16)
    return _html(f"<!doctype html><meta charset=utf-8><title>review</title><p>{html.escape(page.visible(why))}</p>", nonce,
                 status)


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


def _form(desk: Desk, body: bytes) -> dict[str, str]:
    """The form's fields, each given once and each one the page asks for, else ``FormError`` naming the first bad."""
    allowed = {q.name for q in desk.questions} | set(FORM_FIELDS)
    try:
        pairs = parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True,
                          max_num_fields=len(allowed))
    except ValueError:
        raise FormError(f"the form has more than the {len(allowed)} fields this queue's page sends") from None
    form: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise FormError(f"the form has a field {name!r} that this queue's page does not ask (its fields: "
                            f"{', '.join(sorted(allowed))})")
        if name in form:
            raise FormError(f"the form gives the field {name!r} twice")
        form[name] = value
    return form


def _answers(desk: Desk, form: dict[str, str]) -> tuple[dict[str, object] | None, str]:
    """(each question's answer checked against it, or None for "can't judge"; the comment), else DataError."""
    comment = form.get("comment", "").strip()
    if len(comment) > page.MAX_COMMENT_CHARS:
        raise DataError(f"the comment is {len(comment)} characters; at most {page.MAX_COMMENT_CHARS}")
    if form.get("cant_judge"):
        return None, comment
    return {q.name: check_answer(q, form.get(q.name)) for q in desk.questions}, comment


class FormError(ValueError):
    """A form the page never sends (a field it does not ask, one given twice): refused with 400."""


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
                   token: str | None = None, ui: str | None = None, guidelines: str | None = None) -> Reviewing:
    """The queue opened for the review page: MLflow pointed at the store, the links' secret (``token`` or a new
    random one), the MLflow UI the trace links open (default: the tracking server, else ``mlflow ui``'s), and the
    owner's guidelines and examples (``guidelines``: a Markdown file, shown on every item)."""
    import mlflow

    from optim.review.desk import open_desk
    from optim.tracking import runs as tracking

    uri = tracking.tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    desk = open_desk(queue, experiment=experiment or tracking.EXPERIMENT, task=task,
                     guidelines=read_guidelines(guidelines) if guidelines else "")
    base = ui or (uri if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000")
    return Reviewing(desk, token or reviewers.new_secret(), base)


def read_guidelines(path: str) -> str:
    """The guidelines file's Markdown (UTF-8, at most ``MAX_GUIDELINES_BYTES``), else ConfigError naming it."""
    from pathlib import Path

    given = Path(path)
    try:
        with given.open("rb") as f:
            raw = f.read(MAX_GUIDELINES_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"--guidelines {path}: cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_GUIDELINES_BYTES:
        raise ConfigError(f"--guidelines {path}: over {MAX_GUIDELINES_BYTES} bytes; keep the guidelines short")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--guidelines {path}: not UTF-8 (byte {exc.start})") from None


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
        if not reviewers.key_matches(state.secret, state.desk.queue_id, reviewer or None, key or None):
            return _refused(reviewers.INVALID)
        reload()
        why = _assigned(state, reviewer)
        if why:
            return _refused(why)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, quote(f"{reviewers.normal(reviewer)}:{key}", safe=""), httponly=True,
                            samesite="strict")
        return response

    @app.get("/")
    def first(request: Request):
        reviewer, why = signed_in(request)
        if why:
            return _refused(why)
        progress, following = _standing(state, reviewer, None)
        if following:
            return RedirectResponse(f"/item/{following}", status_code=303)
        nonce = secrets.token_urlsafe(16)
        body = "<p>Every item of this queue has your answer. Thank you.</p>"
        return _html(page.page(state.desk, reviewer, body=body, progress=progress, nonce=nonce, script=False), nonce)

    @app.get("/items")
    def items(request: Request):
        reviewer, why = signed_in(request)
        if why:
            return _refused(why)
        return _items(state, reviewer)

    def signed_in(request) -> tuple[str | None, str | None]:
        """(the reviewer, or None; why not): the key first, then the queue reloaded and the assignment checked."""
        reviewer, why = _keyed(request, state)
        if why:
            return None, why
        reload()
        why = _assigned(state, reviewer)
        return (None, why) if why else (reviewer, None)

    _item_routes(app, state, signed_in)
    _owner_routes(app, state, reload)
    return app


def _items(state: Reviewing, reviewer: str):
    """The page listing every item in the order the page walks them, with the reviewer's answer to each."""
    desk = state.desk
    found = desk.overview()
    rows = []
    for n, trace_id in enumerate(desk.trace_ids, start=1):
        item_id, by = found.get(trace_id, (trace_id, {}))
        said = [getattr(by.get(q.name, {}).get(reviewer), "value", None) for q in desk.questions]
        state_text = ("not answered" if any(v is None for v in said) else
                      CANT_JUDGE if CANT_JUDGE in said else "; ".join(f"{q.name}: {v}" for q, v in
                                                                      zip(desk.questions, said)))
        rows.append((n, trace_id, item_id, state_text))
    progress, _ = _standing(state, reviewer, None)
    nonce = secrets.token_urlsafe(16)
    return _html(page.page(desk, reviewer, body=page.items_body(rows), progress=progress, nonce=nonce,
                           script=False), nonce)


def _item_routes(app, state: Reviewing, signed_in) -> None:
    @app.get("/item/{trace_id}")
    def show(trace_id: str, request: Request, edit: int = 0):
        reviewer, why = signed_in(request)
        if why:
            return _refused(why)
        if trace_id not in state.desk.trace_ids:
            return _refused(f"trace {trace_id} is not in review queue '{state.desk.name}'", 404)
        return _show(state, reviewer, trace_id, editing=bool(edit))

    @app.post("/item/{trace_id}")
    async def answer(trace_id: str, request: Request):
        reviewer, why = await run_in_threadpool(signed_in, request)
        if why:
            return _refused(why)
        if trace_id not in state.desk.trace_ids:
            return _refused(f"trace {trace_id} is not in review queue '{state.desk.name}'", 404)
        body = await _bounded_body(request)
        if body is None:
            return _refused(f"the form is over {MAX_FORM_BYTES} bytes", 413)
        try:
            values, comment = _answers(state.desk, _form(state.desk, body))
        except FormError as exc:
            return _refused(str(exc), 400)
        except DataError as exc:
            why = str(exc)
            return await run_in_threadpool(lambda: _show(state, reviewer, trace_id, editing=True, message=why,
                                                         status=422))
        await run_in_threadpool(record_answer, state.desk, trace_id, reviewer, values, comment)
        return RedirectResponse(f"/item/{trace_id}", status_code=303)

    @app.post("/item/{trace_id}/withdraw")
    def withdraw(trace_id: str, request: Request):
        reviewer, why = signed_in(request)
        if why:
            return _refused(why)
        if trace_id not in state.desk.trace_ids:
            return _refused(f"trace {trace_id} is not in review queue '{state.desk.name}'", 404)
        withdraw_answer(state.desk, trace_id, reviewer)
        return RedirectResponse(f"/item/{trace_id}", status_code=303)


def _owner_routes(app, state: Reviewing, reload) -> None:
    @app.get("/owner/start")
    def owner_start(key: str = ""):
        if not reviewers.owner_matches(state.secret, state.desk.queue_id, key):
            return _refused(reviewers.INVALID)
        response = RedirectResponse("/owner", status_code=303)
        response.set_cookie(OWNER_COOKIE, key, httponly=True, samesite="strict")
        return response

    @app.get("/owner")
    def owner(request: Request):
        if not _owner(request, state):
            return _refused(reviewers.INVALID)
        reload()
        desk = state.desk
        found = desk.answers()
        people = sorted({who for by in found.values() for said in by.values() for who in said} | set(desk.users))
        rows = [(who, sum(all(who in by.get(q.name, {}) for q in desk.questions) for by in found.values()),
                 sum(any(by.get(q.name, {}).get(who) == CANT_JUDGE for q in desk.questions) for by in found.values()))
                for who in people]
        body = page.owner_body(agreement(found, desk.questions, CANT_JUDGE), rows, len(desk.trace_ids))
        nonce = secrets.token_urlsafe(16)
        return _html(page.page(desk, "the queue's owner", body=body, progress=f"{len(desk.trace_ids)} items",
                               nonce=nonce, script=False), nonce)

    @app.get("/owner/answers.{kind}")
    def export(kind: str, request: Request):
        if not _owner(request, state):
            return _refused(reviewers.INVALID)
        if kind not in ("jsonl", "csv"):
            return _refused("export as answers.jsonl or answers.csv", 404)
        reload()
        rows = answer_rows(state.desk)
        text, media = (as_jsonl(rows), "application/x-ndjson") if kind == "jsonl" else (as_csv(rows), "text/csv")
        filename = f"{state.desk.name}-answers.{kind}".replace('"', "")
        return Response(text, media_type=f"{media}; charset=utf-8", headers={
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename, safe='')}",
            "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
