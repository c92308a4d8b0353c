"""A scripted OpenAI-compatible HTTP server on 127.0.0.1, for tests across processes and fault injection.

It answers ``/health``, ``/v1/models`` and ``/v1/chat/completions`` with the fake LM's responder (so verdicts are
valid JSON for the requested schema), misbehaves on purpose when told to (``FakeOpenAIServer``), and serves OpenAI's
Batch API (``/v1/files``, ``/v1/batches``) through a ``FakeBatches``, whose batched requests get the same answers.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chateval_dspy.testing.billing import chat_segments
from chateval_dspy.testing.fake_batches import FakeBatches
from chateval_dspy.testing.fake_lm import Call, content_text, default_responder, prompt_fields, respond


class FakeOpenAIServer:
    """``with FakeOpenAIServer() as base_url: ...`` (``base_url`` ends in ``/v1``).

    Args:
        faults: Consumed one per chat request before normal answers: an HTTP status, ``"garbage"``, ``"empty"``
            or ``"hang"``.
        hang: A dead endpoint that still accepts connections: every chat request is read and never answered
            until the server closes (``/v1/models`` still answers, as a wedged server's often does).
        billing: An ``OpenAICaching`` (``testing.billing``) that bills each chat request, its state the server's
            prompt cache; None keeps the rough 4-characters-a-token usage with no cache.
        batches: The Batch API's state and knobs (default: ``FakeBatches()``); faults and ``hang`` never touch it.
        delay: Seconds each chat request waits before it is answered (a slow model); requests wait side by side.
        health: The status ``/health`` answers (None: 503 while ``hang``, else 200; 404: a server without one).
        rate_limited: Answer every chat request 429 (a gateway whose limit never resets), until set False.
        retry_after: The ``Retry-After`` header of 429 answers (faults and ``rate_limited``), in seconds.
        redirect: A base (``http://host:port``): every request is answered 307 to the same path there.
    """

    def __init__(self, responder=default_responder, faults: list | None = None, model: str = "fake-served",
                 hang: bool = False, billing=None, batches: FakeBatches | None = None, delay: float = 0.0,
                 health: int | None = None, rate_limited: bool = False, retry_after: float | None = None,
                 redirect: str | None = None):
        self.delay, self.health, self.redirect = delay, health, redirect
        self.rate_limited, self.retry_after = rate_limited, retry_after
        self.responder, self.faults, self.model, self.hang = responder, list(faults or []), model, hang
        self.billing = billing
        self.batches = batches if batches is not None else FakeBatches()
        self.batches.reply = self.reply
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None

    def reply(self, body: dict, fault=None) -> dict:
        """The chat completion the fake returns for ``body`` (``fault``: ``"garbage"`` or ``"empty"`` text)."""
        messages = body.get("messages", [])
        system = content_text(next((m["content"] for m in messages if m["role"] == "system"), ""))
        user = content_text(messages[-1]["content"]) if messages else ""
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
        call = Call(system, user, list(schema.get("properties", {})), prompt_fields(system, user), {}, schema,
                    len(messages))
        if fault == "garbage":
            text = "this is not json {"
        elif fault == "empty":
            text = ""
        else:
            _, text = respond(self.responder, call)
        reply = {"id": "fake", "object": "chat.completion", "model": self.model, "created": 0,
                 "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                 "usage": {"prompt_tokens": len(system + user) // 4, "completion_tokens": len(text) // 4,
                           "total_tokens": (len(system + user) + len(text)) // 4}}
        if self.billing is not None:
            bill = self.billing.bill(chat_segments(None, messages), model=body.get("model", self.model))
            reply["usage"] = bill.openai_usage(self.billing.count(text))
        return reply

    def __enter__(self) -> str:
        self._closing.clear()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self  # what each request's handler answers for
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __exit__(self, *exc) -> None:
        self._closing.set()
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    """One request to a ``FakeOpenAIServer`` (``self.server.fake``)."""

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json", close: bool = False,
              headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(body)))
        try:
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up first (its attempt timed out)
            self.close_connection = True

    def _batches(self, method: str) -> bool:
        """Answer a files/batches request; False when the path is none of theirs."""
        answer = self.server.fake.batches.route(method, self.path, self.headers, self.rfile)
        if answer is not None:
            self._send(*answer, close=answer[0] == 413)  # a refused upload may be left partly unread
        return answer is not None

    def _redirected(self) -> bool:
        """Answer 307 to the fake's ``redirect`` (the body left unread); False when it is not set."""
        fake = self.server.fake
        if not fake.redirect:
            return False
        with fake._lock:
            fake.requests.append({"redirected": self.path})
        self._send(307, b"", close=True, headers={"Location": fake.redirect.rstrip("/") + self.path})
        return True

    def do_DELETE(self):
        if not (self._redirected() or self._batches("DELETE")):
            self._send(404, b'{"error": "not found"}')

    def do_GET(self):
        fake = self.server.fake
        if self._redirected() or self._batches("GET"):
            return
        if self.path.rstrip("/") == "/health":
            status = fake.health or (503 if fake.hang else 200)
            self._send(status, json.dumps({"status": "ok" if status == 200 else "unavailable"}).encode())
        elif self.path.rstrip("/") == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": fake.model}]}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        fake = self.server.fake
        if self._redirected() or self._batches("POST"):
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with fake._lock:
            fake.requests.append({"body": body, "auth": self.headers.get("Authorization")})
        if fake.hang:
            fake._closing.wait()  # released only so that closing the server does not wait on it
            return
        with fake._lock:
            fault = fake.faults.pop(0) if fake.faults else None
        if fault == "hang":
            time.sleep(30)
            return
        if fake.delay > 0:
            time.sleep(fake.delay)
        if fake.rate_limited and fault is None:
            fault = 429
        if isinstance(fault, int):
            wait = {"Retry-After": f"{fake.retry_after:g}"} if fault == 429 and fake.retry_after is not None else {}
            self._send(fault, json.dumps({"error": {"message": f"injected {fault}"}}).encode(), headers=wait)
            return
        self._send(200, json.dumps(fake.reply(body, fault)).encode())
