"""A scripted Anthropic Messages API (``POST /v1/messages``) on 127.0.0.1 that bills by Anthropic's caching rule.

Answers come from the fake LM's responders; usage follows ``billing.AnthropicCaching`` over the request's system
and message content blocks and their ``cache_control`` marks. It answers in the three shapes LiteLLM asks for:
plain text; native structured output (``output_format`` json_schema, for models LiteLLM knows support it) as JSON
text; and, for a json_schema ``response_format`` on older models, the forced tool ``json_tool_call`` as a
``tool_use`` block. Message Batches (``/v1/messages/batches``) answer each request through the same path.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chateval_dspy.testing.billing import AnthropicCaching, CacheControlError, chat_segments
from chateval_dspy.testing.fake_lm import Call, content_text, default_responder, prompt_fields, respond

# The outputs as the system prompt lists them, the fallback when no schema is sent: DSPy's own adapters
# ("1. `name` ...") or the judge adapter's layout ("- name ...").
_OUTPUTS = re.compile(r"(?:Your output fields are:|Reply with a JSON object holding these fields, in this order:)\n(.*?)"
                      r"(?:\n\n|\Z)", re.S)
_NAMES = re.compile(r"^(?:\d+\. `|- )(\w+)", re.M)


def _schema(body: dict, system: str) -> tuple[dict, str | None]:
    """The output JSON schema a request asks for, and the name of the tool to answer with (if forced)."""
    fmt = body.get("output_format") or {}
    if fmt.get("schema"):
        return fmt["schema"], None
    forced = (body.get("tool_choice") or {}).get("name")
    tool = next((t for t in body.get("tools") or () if t.get("name") == forced), None)
    if tool:
        return tool.get("input_schema") or {}, tool["name"]
    found = _OUTPUTS.search(system)
    names = _NAMES.findall(found.group(1)) if found else []
    return {"type": "object", "properties": {n: {"type": "string"} for n in names}}, None


def anthropic_call(body: dict) -> tuple[Call, str | None]:
    """The fake LM's view of a Messages request, and the forced tool's name (None: answer in text)."""
    system = content_text(body.get("system"))
    messages = body.get("messages") or []
    user = content_text(messages[-1].get("content")) if messages else ""
    schema, tool = _schema(body, system)
    call = Call(system, user, list(schema.get("properties", {})), prompt_fields(system, user),
                {"temperature": body.get("temperature"), "max_tokens": body.get("max_tokens")}, schema,
                len(messages), tuple((m.get("role", ""), content_text(m.get("content"))) for m in messages[:-1]))
    return call, tool


def _error(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


class FakeAnthropicServer:
    """``with FakeAnthropicServer() as base_url: ...``; ``base_url`` is ``http://127.0.0.1:PORT``.

    Give LiteLLM that base: ``dspy.LM("anthropic/<model>", engine="litellm", api_base=base_url, api_key="x")``
    posts to ``<base>/v1/messages`` (a base ending in ``/v1`` makes it post to ``/v1/v1/messages``, which is
    answered too). ``requests`` records each request as ``{"path", "headers", "body"}``; ``bills`` each ``Bill``.

    Batches: ``submitted`` counts each ``custom_id``'s submissions and ``batch_ids`` lists the batches in order;
    a batch's requests are answered (and billed) when it is submitted, its results shown once it has ended.

    Args:
        billing: The caching rule and its state (default: a fresh ``AnthropicCaching``, minimum by model).
        batch_delay: Seconds a batch stays ``in_progress`` after its submission.
        expire_batches: The next this-many batches end with only the first half of their requests (rounded down)
            answered, the rest ``expired``.
        fail: ``{custom_id: error type}`` (``"overloaded_error"`` ...): that request errors once, the next time it
            is submitted; a resubmission succeeds.
        api_key: When set, batch endpoints refuse another ``x-api-key`` with 401 (``/v1/messages`` does not check).
    """

    def __init__(self, responder=default_responder, billing: AnthropicCaching | None = None, *,
                 batch_delay: float = 0.0, expire_batches: int = 0, fail: dict | None = None,
                 api_key: str | None = None):
        self.responder = responder
        self.billing = billing or AnthropicCaching()
        self.requests: list[dict] = []
        self.bills: list = []
        self.batch_delay, self.expire_batches, self.fail = batch_delay, expire_batches, dict(fail or {})
        self.api_key = api_key
        self.submitted: Counter = Counter()
        self.batch_ids: list[str] = []
        self.base_url = ""
        self._batches: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    def answer(self, body: dict) -> tuple[int, dict]:
        """The status and JSON body the fake returns for one Messages request."""
        try:
            bill = self.billing.bill(chat_segments(body.get("system"), body.get("messages") or []),
                                     model=body.get("model", ""))
        except CacheControlError as exc:
            return 400, _error("invalid_request_error", str(exc))
        with self._lock:
            self.bills.append(bill)
        call, tool = anthropic_call(body)
        out, text = respond(self.responder, call)
        if tool and isinstance(out, dict):
            content, stop = [{"type": "tool_use", "id": "toolu_fake", "name": tool, "input": out}], "tool_use"
        else:
            content, stop = [{"type": "text", "text": text}], "end_turn"
        return 200, {"id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model", ""),
                     "content": content, "stop_reason": stop, "stop_sequence": None,
                     "usage": bill.anthropic_usage(self.billing.count(text))}

    def create_batch(self, body: dict) -> tuple[int, dict]:
        """The status and batch object for ``POST /v1/messages/batches``; answers every request at once."""
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests or not all(isinstance(r, dict) for r in requests):
            return 400, _error("invalid_request_error", "requests: a non-empty list of objects is required")
        ids = [r.get("custom_id") for r in requests]
        with self._lock:
            expire = self.expire_batches > 0
            self.expire_batches -= expire
            batch_id = f"msgbatch_fake{len(self.batch_ids) + 1:04d}"
            self.batch_ids.append(batch_id)
            self.submitted.update(ids)
            failing = {i: self.fail.pop(i) for i in ids if i in self.fail}
            created, delay = time.time(), self.batch_delay
        answered = len(requests) // 2 if expire else len(requests)
        results = [{"custom_id": r.get("custom_id"), "result": self._batch_result(r, n >= answered, failing)}
                   for n, r in enumerate(requests)]
        with self._lock:  # the delay runs from the reply, however long answering took
            self._batches[batch_id] = {"created": created, "ready": time.time() + delay, "results": results}
        return 200, self.batch(batch_id)

    def _batch_result(self, request: dict, expired: bool, failing: dict) -> dict:
        if expired:
            return {"type": "expired"}
        if request.get("custom_id") in failing:
            kind = failing[request.get("custom_id")]
            return {"type": "errored", "error": _error(kind, f"fake {kind}")}
        status, payload = self.answer(request.get("params") or {})
        return {"type": "succeeded", "message": payload} if status == 200 else {"type": "errored", "error": payload}

    def batch(self, batch_id: str) -> dict | None:
        """The batch object ``GET /v1/messages/batches/{id}`` returns (None: no such batch)."""
        with self._lock:
            entry = self._batches.get(batch_id)
        if entry is None:
            return None
        ended = time.time() >= entry["ready"]
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        for row in entry["results"]:
            counts[row["result"]["type"] if ended else "processing"] += 1
        return {"id": batch_id, "type": "message_batch", "processing_status": "ended" if ended else "in_progress",
                "request_counts": counts, "created_at": _iso(entry["created"]),
                "ended_at": _iso(entry["ready"]) if ended else None, "expires_at": _iso(entry["created"] + 86400),
                "cancel_initiated_at": None, "archived_at": None,
                "results_url": f"{self.base_url}/v1/messages/batches/{batch_id}/results" if ended else None}

    def batch_results(self, batch_id: str) -> tuple[int, dict | bytes]:
        """The status and body of ``GET /v1/messages/batches/{id}/results``: JSON Lines once the batch has ended."""
        batch = self.batch(batch_id)
        if batch is None:
            return 404, _error("not_found_error", f"no batch {batch_id}")
        if batch["processing_status"] != "ended":
            return 400, _error("invalid_request_error", f"batch {batch_id} is still in progress")
        with self._lock:
            rows = list(self._batches[batch_id]["results"])
        return 200, b"".join(json.dumps(row).encode() + b"\n" for row in rows)

    def _batch_route(self, method: str, path: str, headers, body: dict | None) -> tuple[int, dict | bytes] | None:
        # None: not a batch path, left to the Messages route.
        found = re.fullmatch(r"/v1/messages/batches(?:/([^/]+)(/results)?)?", path)
        if not found or (method == "POST") != (found.group(1) is None):
            return None
        if self.api_key is not None and headers.get("x-api-key") != self.api_key:
            return 401, _error("authentication_error", "invalid x-api-key")
        if method == "POST":
            return self.create_batch(body or {})
        if found.group(2):
            return self.batch_results(found.group(1))
        batch = self.batch(found.group(1))
        return (200, batch) if batch else (404, _error("not_found_error", f"no batch {found.group(1)}"))

    def __enter__(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, status: int, payload: dict | bytes):
                raw = isinstance(payload, bytes)  # a batch's results file, already JSON Lines
                body = payload if raw else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/binary" if raw else "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                path = self.path.split("?")[0].rstrip("/")
                routed = server._batch_route("POST", path, self.headers, body)
                if routed is None and not path.endswith("/v1/messages"):
                    routed = 404, _error("not_found_error", self.path)
                self._send(*(routed or server.answer(body)))

            def do_GET(self):
                routed = server._batch_route("GET", self.path.split("?")[0].rstrip("/"), self.headers, None)
                self._send(*(routed or (404, _error("not_found_error", self.path))))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll keeps closing quick (the default waits up to half a second).
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        return self.base_url

    def __exit__(self, *exc) -> None:
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
