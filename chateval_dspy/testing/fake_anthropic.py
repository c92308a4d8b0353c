"""A scripted Anthropic Messages API (``POST /v1/messages``) on 127.0.0.1 that bills by Anthropic's caching rule.

Answers come from the fake LM's responders; usage follows ``billing.AnthropicCaching`` over the request's
``system`` and message content blocks, with the ``cache_control`` marks found there. It answers in the three
shapes LiteLLM asks for: plain text; native structured output (``output_format`` json_schema, sent for models
LiteLLM knows to support it, e.g. Claude Sonnet 4.5) as JSON text; and the forced tool LiteLLM uses for a
json_schema ``response_format`` on older models (a tool named ``json_tool_call`` with ``tool_choice``) as a
``tool_use`` block whose input LiteLLM turns back into the message text.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chateval_dspy.testing.billing import AnthropicCaching, CacheControlError, chat_segments
from chateval_dspy.testing.fake_lm import Call, default_responder, prompt_fields, with_stated_preference

# The outputs as the system prompt lists them, the fallback when no schema is sent: DSPy's own adapters
# ("1. `name` ...") or the judge adapter's layout ("- name ...").
_OUTPUTS = re.compile(r"(?:Your output fields are:|Reply with a JSON object holding these fields, in this order:)\n(.*?)"
                      r"(?:\n\n|\Z)", re.S)
_NAMES = re.compile(r"^(?:\d+\. `|- )(\w+)", re.M)


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or () if isinstance(b, dict))


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
    system = _text(body.get("system"))
    messages = body.get("messages") or []
    user = _text(messages[-1].get("content")) if messages else ""
    schema, tool = _schema(body, system)
    call = Call(system, user, list(schema.get("properties", {})), prompt_fields(system, user),
                {"temperature": body.get("temperature"), "max_tokens": body.get("max_tokens")}, schema,
                len(messages), tuple((m.get("role", ""), _text(m.get("content"))) for m in messages[:-1]))
    return call, tool


class FakeAnthropicServer:
    """``with FakeAnthropicServer() as base_url: ...``; ``base_url`` is ``http://127.0.0.1:PORT``.

    Give LiteLLM that base: ``dspy.LM("anthropic/<model>", engine="litellm", api_base=base_url, api_key="x")``
    posts to ``<base>/v1/messages`` (a base ending in ``/v1`` makes it post to ``/v1/v1/messages``, which is
    answered too). ``requests`` records each request as ``{"path", "headers", "body"}``; ``bills`` each ``Bill``.

    Args:
        responder: Makes each answer from the request (as the fake LM's responders do).
        billing: The caching rule and its state (default: a fresh ``AnthropicCaching``, minimum by model).
    """

    def __init__(self, responder=default_responder, billing: AnthropicCaching | None = None):
        self.responder = responder
        self.billing = billing or AnthropicCaching()
        self.requests: list[dict] = []
        self.bills: list = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    def answer(self, body: dict) -> tuple[int, dict]:
        """The status and JSON body the fake returns for one Messages request."""
        try:
            bill = self.billing.bill(chat_segments(body.get("system"), body.get("messages") or []),
                                     model=body.get("model", ""))
        except CacheControlError as exc:
            return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": str(exc)}}
        with self._lock:
            self.bills.append(bill)
        call, tool = anthropic_call(body)
        out = with_stated_preference(call, self.responder(call))
        text = out if isinstance(out, str) else json.dumps(out)
        if tool and isinstance(out, dict):
            content, stop = [{"type": "tool_use", "id": "toolu_fake", "name": tool, "input": out}], "tool_use"
        else:
            content, stop = [{"type": "text", "text": text}], "end_turn"
        return 200, {"id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model", ""),
                     "content": content, "stop_reason": stop, "stop_sequence": None,
                     "usage": bill.anthropic_usage(self.billing.count(text))}

    def __enter__(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, status: int, payload: dict):
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if not self.path.split("?")[0].rstrip("/").endswith("/v1/messages"):
                    self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
                    return
                self._send(*server.answer(body))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll keeps closing quick (the default waits up to half a second).
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __exit__(self, *exc) -> None:
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
