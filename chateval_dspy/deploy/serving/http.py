"""An HTTP JSON API over a loaded evaluator (FastAPI app, served by uvicorn).

- ``POST /evaluate``: one item (an object) or a list of items -> verdict(s)
- ``GET /health``: liveness, no auth
- ``GET /card``: the judge card

Requests are validated (bad or too deeply nested JSON 400, wrong shape or fields 422, too large 413, counted as the
body streams in, the connection then closed rather than drained), at most ``queue`` are in flight (the next gets 503),
and an optional bearer token guards everything but ``/health``. One LM (server) is shared by all requests.
"""

from __future__ import annotations

import hmac
import json
import threading

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from chateval_dspy.concurrency import parallel_map
from chateval_dspy.data.loaders import item_from_record
from chateval_dspy.errors import DataError

# Items are flat objects (a list of them nests 2 deep); the cap leaves room for extra metadata
# while keeping every later walk over the payload (str(), repr(), encoders) far from the recursion limit.
MAX_JSON_DEPTH = 32


def create_app(evaluator, *, token: str | None = None, max_body_bytes: int = 1_000_000, max_items: int = 32,
               queue: int = 4, concurrency: int = 2) -> FastAPI:
    """The API for ``evaluator`` (a loaded ``Judge``, or a ``CascadeJudge``: each verdict then names its ``stage``).

    ``token``: requests must send ``Authorization: Bearer <token>``. ``max_body_bytes``, ``max_items``: larger bodies
    and longer lists get 413. ``queue``: requests handled at once. ``concurrency``: items of one list judged at once.
    """
    version = evaluator.card.get("versions", {}).get("chateval-dspy", "?")
    # With a token, FastAPI's own schema and docs routes (which know nothing of it) are off and the schema is served
    # from a guarded route; the HTML docs stay off, as their page fetches the schema without the header.
    app = FastAPI(title="chateval-dspy", version=version, **(
        {"openapi_url": None, "docs_url": None, "redoc_url": None} if token else {}))
    slots = threading.BoundedSemaphore(queue)

    stages = getattr(evaluator, "stages", None)  # a cascade: each stage on its own model
    models = {"stages": {s.name: j.lm.model for s, j in zip(evaluator.spec.stages, stages)}} if stages is not None \
        else {"model": evaluator.lm.model}

    @app.get("/health")
    def health():
        return {"status": "ok", "format": evaluator.format, **models}

    if token:
        @app.get("/openapi.json", include_in_schema=False)
        def openapi(request: Request):
            if not _authorised(request, token):
                return _unauthorised()
            return app.openapi()

    @app.get("/card")
    def card(request: Request):
        if not _authorised(request, token):
            return _unauthorised()
        return evaluator.card

    @app.post("/evaluate")
    async def evaluate(request: Request):
        if not _authorised(request, token):
            return _unauthorised(unread_body=True)
        body = await _read_body(request, max_body_bytes)
        parsed = body if isinstance(body, JSONResponse) else _items(body, max_items)
        if isinstance(parsed, JSONResponse):
            return parsed
        items, many = parsed
        if not slots.acquire(blocking=False):
            return JSONResponse({"error": "server busy: too many requests in flight, retry later"}, status_code=503,
                                headers={"Retry-After": "5"})
        try:
            verdicts = await run_in_threadpool(_judge, evaluator, items, concurrency)
        except DataError as exc:
            return _error(422, str(exc))
        finally:
            slots.release()
        return verdicts if many else verdicts[0]

    return app


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _unauthorised(*, unread_body: bool = False) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"}
    if unread_body:
        headers["Connection"] = "close"  # else uvicorn reads and discards the rest of the body
    return _error(401, "missing or wrong bearer token", headers)


def _too_large(message: str) -> JSONResponse:
    # Closing is what stops the upload; keep-alive would make uvicorn read the rest to find the next request.
    return _error(413, message, {"Connection": "close"})


def _authorised(request: Request, token: str | None) -> bool:
    if not token:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


async def _read_body(request: Request, max_body_bytes: int) -> bytes | JSONResponse:
    """The request's body, or 413 as soon as it passes the limit (declared, or counted as it arrives)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        return _too_large(f"body is {declared} bytes; the limit is {max_body_bytes}")
    # Counted as it arrives: a chunked body declares no length, and request.body() would hold all of it.
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body_bytes:
            return _too_large(f"body is over the limit of {max_body_bytes} bytes")
    return bytes(body)


def _items(body: bytes, max_items: int) -> tuple[list[dict], bool] | JSONResponse:
    """``(items, whether a list was sent)`` of a body, or the 400/422/413 that refuses it."""
    too_deep = f"body nests JSON arrays/objects more than {MAX_JSON_DEPTH} levels deep"
    try:
        payload = json.loads(body)
    except RecursionError:
        return _error(400, too_deep)
    except ValueError as exc:  # also bad UTF-8 and integers past Python's digit limit
        return _error(400, f"body is not valid JSON: {exc}")
    if _deeper_than(payload, MAX_JSON_DEPTH):
        return _error(400, too_deep)
    many = isinstance(payload, list)
    items = payload if many else [payload]
    if not items or not all(isinstance(x, dict) for x in items):
        return _error(422, "send one item (a JSON object) or a non-empty list of items")
    if len(items) > max_items:
        return _error(413, f"{len(items)} items in one request; the limit is {max_items}")
    return items, many


def _judge(evaluator, items: list[dict], concurrency: int) -> list[dict]:
    # Validate every item before spending any LM call on the request.
    for i, item in enumerate(items, start=1):
        item_from_record(item, getattr(evaluator, "task", evaluator.format), source="request", row=i)
    verdicts = parallel_map(lambda pair: evaluator(pair[1], row=pair[0], source="request"),
                            list(enumerate(items, start=1)), concurrency)
    return [v.to_dict() for v in verdicts]


def _deeper_than(value, limit: int) -> bool:
    """Whether ``value`` nests lists/dicts more than ``limit`` deep; level by level, so deep input cannot overflow it."""
    # json.loads makes plain lists and dicts, so exact type tests suffice. This runs on every body, hostile ones
    # included (a megabyte of [[],[],...]): plain loops with `type() is` take half the time of isinstance comprehensions.
    level = [value] if type(value) is list or type(value) is dict else []
    for _ in range(limit):
        below = []
        for container in level:
            for child in container.values() if type(container) is dict else container:
                if type(child) is list or type(child) is dict:
                    below.append(child)
        if not below:
            return False
        level = below
    return bool(level)
