"""``chateval review serve``: the review page, a small FastAPI app over an MLflow review queue (what it offers, and
why not MLflow's own Review page: docs/review.md, "The review page").

It reads the same queue and questions and writes the same Feedback (``optim.review.desk``), under each reviewer's
own name (``optim.review.reviewers``). Every request's key is checked before anything is read from MLflow, so
requests without a valid key cost no tracking-server call; a form with a field no question asks is refused (400).
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
from optim.review.desk import CANT_JUDGE, Desk, check_answer, has_answered, record_answer, values_of, withdraw_answer
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


class Refused(Exception):
    """A request the page refuses, with the reason it shows and the HTTP status (403 unless said)."""

    def __init__(self, why: str, status: int = 403):
        super().__init__(why)
        self.status = status


def _standing(state: Reviewing, reviewer: str, current: str | None) -> tuple[str, str | None]:
    """(progress line, the next item the reviewer has not answered after ``current``) as MLflow holds them now."""
    desk = state.desk
    answers = desk.answers()
    done = {t for t in desk.trace_ids if has_answered(answers.get(t, {}), reviewer, desk.questions)}
    progress = f"{len(done)} of {len(desk.trace_ids)} answered by you"
    at = desk.trace_ids.index(current) + 1 if current in desk.trace_ids else 0  # walk on from current, round to it
    following = next((t for t in desk.trace_ids[at:] + desk.trace_ids[:at] if t not in done and t != current), None)
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


def _html(body: str, nonce: str | None = None, status: int = 200):
    return HTMLResponse(body, status_code=status, headers={
        "Content-Security-Policy": CSP.format(nonce=nonce or secrets.token_urlsafe(16)), "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})


def _refused(why: str, status: int = 403):
    return _html(f"<!doctype html><meta charset=utf-8><title>review</title><p>{html.escape(page.visible(why))}</p>",
                 status=status)


def _page(desk: Desk, reviewer: str, *, status: int = 200, **parts):
    """A whole page (``page.page``) under its own nonce."""
    nonce = secrets.token_urlsafe(16)
    return _html(page.page(desk, reviewer, nonce=nonce, **parts), nonce, status)


def _show(state: Reviewing, reviewer: str, trace_id: str, *, editing: bool = False, message: str | None = None,
          status: int = 200):
    desk = state.desk
    progress, following = _standing(state, reviewer, trace_id)
    item = desk.item(trace_id)
    next_url = f"/item/{following}" if following else None
    body = page.item_body(desk, item, reviewer=reviewer, action=f"/item/{trace_id}", next_url=next_url,
                          trace_url=state.trace_url(trace_id), editing=editing)
    return _page(desk, reviewer, body=body, progress=progress, item=item, next_url=next_url, message=message,
                 status=status)


def _form(desk: Desk, body: bytes) -> dict[str, str]:
    """The form's fields, each given once and each one the page asks for, else ``Refused`` (400) naming the first bad."""
    allowed = {q.name for q in desk.questions} | set(FORM_FIELDS)
    try:
        pairs = parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True,
                          max_num_fields=len(allowed))
    except ValueError:
        raise Refused(f"the form has more than the {len(allowed)} fields this queue's page sends", 400) from None
    form: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise Refused(f"the form has a field {name!r} that this queue's page does not ask (its fields: "
                          f"{', '.join(sorted(allowed))})", 400)
        if name in form:
            raise Refused(f"the form gives the field {name!r} twice", 400)
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


async def _bounded_body(request) -> bytes:
    """The request's body, refused (413) once it passes ``MAX_FORM_BYTES`` (read no further)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise Refused(f"the form is over {MAX_FORM_BYTES} bytes", 413)
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
    return Reviewing(desk, token or secrets.token_urlsafe(32), base)  # no token: links last as long as the process


def read_guidelines(path: str) -> str:
    """The guidelines file's Markdown (UTF-8, at most ``MAX_GUIDELINES_BYTES``), else ConfigError naming it."""
    try:
        with open(path, "rb") as f:
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
    """The review page's app over ``state``."""
    app = FastAPI(title="chateval review", openapi_url=None, docs_url=None, redoc_url=None)
    lock = threading.Lock()
    app.add_exception_handler(Refused, lambda request, exc: _refused(str(exc), exc.status))

    def reload() -> None:
        with lock:
            state.desk.reload()

    def admitted(reviewer: str, key: str) -> str:
        """``reviewer`` when ``key`` is theirs and they are assigned, else Refused; the key is checked before the
        queue is reloaded (reviewers can be added while it is served)."""
        if not reviewers.key_matches(state.secret, state.desk.queue_id, reviewer or None, key or None):
            raise Refused(reviewers.INVALID)
        reload()
        why = reviewers.refusal(state.secret, state.desk.queue_id, reviewer, key, state.desk.users)
        if why:
            raise Refused(why)
        return reviewers.normal(reviewer)

    def signed_in(request, trace_id: str | None = None) -> str:
        """The reviewer whose link set the cookie (``admitted``), and ``trace_id`` in the queue; else Refused."""
        # The key is hex: the last ':' ends the name, whatever the name holds.
        name, _, key = unquote(request.cookies.get(COOKIE, "")).rpartition(":")
        reviewer = admitted(name, key)
        if trace_id is not None and trace_id not in state.desk.trace_ids:
            raise Refused(f"trace {trace_id} is not in review queue '{state.desk.name}'", 404)
        return reviewer

    @app.get("/health")
    def health():
        return JSONResponse({"status": "ok", "queue": state.desk.name})

    @app.get("/start")
    def start(reviewer: str = "", key: str = ""):
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, quote(f"{admitted(reviewer, key)}:{key}", safe=""), httponly=True,
                            samesite="strict")
        return response

    @app.get("/")
    def first(request: Request):
        reviewer = signed_in(request)
        progress, following = _standing(state, reviewer, None)
        if following:
            return RedirectResponse(f"/item/{following}", status_code=303)
        body = "<p>Every item of this queue has your answer. Thank you.</p>"
        return _page(state.desk, reviewer, body=body, progress=progress, script=False)

    @app.get("/items")
    def items(request: Request):
        return _items(state, signed_in(request))

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
        rows.append((n, trace_id, item_id, page.answer_text(values_of(by), reviewer, desk.questions) or "not answered"))
    progress, _ = _standing(state, reviewer, None)
    return _page(desk, reviewer, body=page.render("items", rows=rows), progress=progress, script=False)


def _item_routes(app, state: Reviewing, signed_in) -> None:
    @app.get("/item/{trace_id}")
    def show(trace_id: str, request: Request, edit: int = 0):
        return _show(state, signed_in(request, trace_id), trace_id, editing=bool(edit))

    @app.post("/item/{trace_id}")
    async def answer(trace_id: str, request: Request):
        reviewer = await run_in_threadpool(signed_in, request, trace_id)
        body = await _bounded_body(request)
        try:
            values, comment = _answers(state.desk, _form(state.desk, body))
        except DataError as exc:
            why = str(exc)
            return await run_in_threadpool(lambda: _show(state, reviewer, trace_id, editing=True, message=why,
                                                         status=422))
        await run_in_threadpool(record_answer, state.desk, trace_id, reviewer, values, comment)
        return RedirectResponse(f"/item/{trace_id}", status_code=303)

    @app.post("/item/{trace_id}/withdraw")
    def withdraw(trace_id: str, request: Request):
        withdraw_answer(state.desk, trace_id, signed_in(request, trace_id))
        return RedirectResponse(f"/item/{trace_id}", status_code=303)


def _owner_routes(app, state: Reviewing, reload) -> None:
    def owner_only(key: str) -> None:
        if not reviewers.owner_matches(state.secret, state.desk.queue_id, key):
            raise Refused(reviewers.INVALID)

    @app.get("/owner/start")
    def owner_start(key: str = ""):
        owner_only(key)
        response = RedirectResponse("/owner", status_code=303)
        response.set_cookie(OWNER_COOKIE, key, httponly=True, samesite="strict")
        return response

    @app.get("/owner")
    def owner(request: Request):
        owner_only(request.cookies.get(OWNER_COOKIE, ""))
        reload()
        desk = state.desk
        found = desk.answers()
        people = sorted({who for by in found.values() for said in by.values() for who in said} | set(desk.users))
        rows = [(who, sum(has_answered(by, who, desk.questions) for by in found.values()),
                 sum(any(by.get(q.name, {}).get(who) == CANT_JUDGE for q in desk.questions) for by in found.values()))
                for who in people]
        body = page.render("owner", agreement=agreement(found, desk.questions, CANT_JUDGE), reviewers=rows,
                           total=len(desk.trace_ids))
        return _page(desk, "the queue's owner", body=body, progress=f"{len(desk.trace_ids)} items", script=False)

    @app.get("/owner/answers.{kind}")
    def export(kind: str, request: Request):
        owner_only(request.cookies.get(OWNER_COOKIE, ""))
        if kind not in ("jsonl", "csv"):
            raise Refused("export as answers.jsonl or answers.csv", 404)
        reload()
        rows = answer_rows(state.desk)
        text, media = (as_jsonl(rows), "application/x-ndjson") if kind == "jsonl" else (as_csv(rows), "text/csv")
        filename = f"{state.desk.name}-answers.{kind}".replace('"', "")
        return Response(text, media_type=f"{media}; charset=utf-8", headers={
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename, safe='')}",
            "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
