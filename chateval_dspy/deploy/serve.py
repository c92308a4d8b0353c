"""An HTTP JSON API over a loaded evaluator (FastAPI app, served by uvicorn).

- ``POST /evaluate``: one item (an object) or a list of items -> verdict(s)
- ``GET /health``: liveness, no auth
- ``GET /card``: the judge card

Requests are validated (bad JSON 400, wrong shape or fields 422, too large 413), at most
``queue`` requests are in flight and the next gets 503 instead of piling up, an optional
bearer token guards everything but ``/health``, and one LM (server) is shared by all requests.
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


def create_app(evaluator, *, token: str | None = None, max_body_bytes: int = 1_000_000, max_items: int = 32,
               queue: int = 4, concurrency: int = 2) -> FastAPI:
    """The API for ``evaluator`` (a loaded ``Judge``).

    Args:
        token: When set, requests must send ``Authorization: Bearer <token>``.
        max_body_bytes: Larger request bodies get 413.
        max_items: Longer lists get 413.
        queue: Requests handled at once; the next one gets 503 (retry later).
        concurrency: Items of one list judged at once.
    """
    app = FastAPI(title="chateval-dspy", version=evaluator.card.get("versions", {}).get("chateval-dspy", "?"))
    slots = threading.BoundedSemaphore(queue)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def authorised(request: Request) -> bool:
        if not token:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    @app.get("/health")
    def health():
        return {"status": "ok", "format": evaluator.format, "model": evaluator.lm.model}

    @app.get("/card")
    def card(request: Request):
        if not authorised(request):
            return error(401, "missing or wrong bearer token")
        return evaluator.card

    @app.post("/evaluate")
    async def evaluate(request: Request):
        if not authorised(request):
            return error(401, "missing or wrong bearer token")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_body_bytes:
            return error(413, f"body is {declared} bytes; the limit is {max_body_bytes}")
        body = await request.body()
        if len(body) > max_body_bytes:
            return error(413, f"body is {len(body)} bytes; the limit is {max_body_bytes}")
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return error(400, f"body is not valid JSON: {exc}")
        many = isinstance(payload, list)
        items = payload if many else [payload]
        if not items or not all(isinstance(x, dict) for x in items):
            return error(422, "send one item (a JSON object) or a non-empty list of items")
        if len(items) > max_items:
            return error(413, f"{len(items)} items in one request; the limit is {max_items}")
        if not slots.acquire(blocking=False):
            return JSONResponse({"error": "server busy: too many requests in flight, retry later"}, status_code=503,
                                headers={"Retry-After": "5"})
        try:
            verdicts = await run_in_threadpool(_judge, evaluator, items, concurrency)
        except DataError as exc:
            return error(422, str(exc))
        finally:
            slots.release()
        return verdicts if many else verdicts[0]

    return app


def _judge(evaluator, items: list[dict], concurrency: int) -> list[dict]:
    # Validate every item before spending any LM call on the request.
    for i, item in enumerate(items, start=1):
        item_from_record(item, evaluator.format, source="request", row=i)
    verdicts = parallel_map(lambda pair: evaluator(pair[1], row=pair[0], source="request"),
                            list(enumerate(items, start=1)), concurrency)
    return [v.to_dict() for v in verdicts]
