"""Anthropic's Message Batches API as a ``BatchProvider``, over httpx (no ``anthropic`` SDK needed).

``messages_params`` and ``chat_completion`` translate to and from OpenAI's format. What the API returns is untrusted:
the download is capped, every line checked, and a malformed answer is that request's error, not the batch's.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Collection
from urllib.parse import urlsplit

import httpx

from chateval_dspy.errors import ConfigError, FatalLMError
from chateval_dspy.limits import MAX_BATCH_RESULT_BYTES, batch_result_bytes
from chateval_dspy.lm.batch.provider import BatchRequest, BatchState, Outcome, asked_outcomes, capped_lines
from chateval_dspy.lm.layout import REFEREE_FIELDS, TURN_FIELDS, text_block

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
JSON_TOOL = "json_tool_call"  # LiteLLM's name for the forced tool, so answers look as they do through LiteLLM
DEFAULT_MAX_TOKENS = 1024  # Anthropic requires max_tokens; OpenAI bodies may leave it out
# Claude writes at most 128k output tokens (about half a million characters): more is not a real answer.
MAX_TEXT_CHARS = 2 * 2**20
MAX_BATCH_REQUESTS = 100_000  # Anthropic's limits per batch
MAX_BATCH_BYTES = 256 * 10**6
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
                "api_error": 500, "timeout_error": 504, "overloaded_error": 529}
_FINISH = {"end_turn": "stop", "tool_use": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "refusal": "content_filter"}
_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_BATCH_ID = re.compile(r"[a-zA-Z0-9_-]{1,128}")  # it becomes part of a URL path
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504, 529})


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text") or "" for b in content or () if isinstance(b, dict))


def with_marks(body: dict, mark_item: bool) -> dict:
    r"""``body`` with Anthropic's cache breakpoints where a live call's ``DebateAdapter`` puts them: after the static
    part and, when ``mark_item``, after the item's texts (before the first referee or turn field header: judged
    texts cannot hold one, so the first is the layout's).

    Example:
        >>> b = with_marks({"messages": [{"role": "system", "content": "Rules."}, {"role": "user", "content":
        ...                 "[[ ## question ## ]]\nq\n\n[[ ## persona ## ]]\nA critic."}]}, mark_item=True)
        >>> [(x["text"], "cache_control" in x) for x in b["messages"][1]["content"]]
        [('[[ ## question ## ]]\nq\n\n', True), ('[[ ## persona ## ]]\nA critic.', False)]
    """
    messages = [dict(m) for m in body.get("messages") or ()]
    if len(messages) >= 2:
        messages[-2]["content"] = [text_block(_text(messages[-2]["content"]), marked=True)]
    if mark_item and messages:
        text = _text(messages[-1]["content"])
        heads = [text.find(f"\n\n[[ ## {name} ## ]]\n") for name in REFEREE_FIELDS + TURN_FIELDS]
        cut = min((h for h in heads if h > 0), default=-1)
        if cut > 0:
            messages[-1]["content"] = [text_block(text[:cut + 2], marked=True), text_block(text[cut + 2:])]
    return {**body, "messages": messages}


def _short(text, limit: int = 300) -> str:
    # Server text reaches logs and terminals: bounded, and without control characters.
    text = str(text)
    clean = "".join(c if c.isprintable() else " " for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")


def messages_params(body: dict) -> dict:
    """The Messages ``params`` for an OpenAI chat-completions ``body``: the system text one block marked for caching
    (our static part comes first), a json_schema ``response_format`` a forced tool (as LiteLLM sends it).

    Example:
        >>> p = messages_params({"model": "anthropic/claude-3-5-haiku", "temperature": 0, "stop": "END",
        ...                      "messages": [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Q"}]})
        >>> p["model"], p["max_tokens"], p["messages"], p["stop_sequences"]
        ('claude-3-5-haiku', 1024, [{'role': 'user', 'content': 'Q'}], ['END'])
        >>> p["system"]
        [{'type': 'text', 'text': 'Judge.', 'cache_control': {'type': 'ephemeral'}}]
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError("a batch request's body names no model")
    system, messages = [], []
    for message in body.get("messages") or ():
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(message.get("content"))
        elif role in ("user", "assistant"):
            messages.append({"role": role, "content": message.get("content")})
        else:
            raise ConfigError(f"Anthropic batches take system, user and assistant messages, not {role!r}")
    params = {"model": model.removeprefix("anthropic/"),
              "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS,
              "messages": messages}
    if any(isinstance(c, list) for c in system + [m["content"] for m in messages]):
        params["system"] = [b for c in system for b in (c if isinstance(c, list) else [text_block(c)]) if b.get("text")]
    else:  # no breakpoints given (``with_marks``): the end of the system text is the static prefix's
        text = "\n\n".join(_text(t) for t in system if t)
        if text:  # Anthropic refuses an empty text block
            params["system"] = [text_block(text, marked=True)]
    if body.get("temperature") is not None:
        params["temperature"] = body["temperature"]
    stop = body.get("stop")
    if stop:
        params["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
        params["tools"] = [{"name": JSON_TOOL, "input_schema": schema}]
        params["tool_choice"] = {"type": "tool", "name": JSON_TOOL}
    return params


def _count(usage: dict, key: str) -> int:
    value = usage.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"usage {key} is not a token count")
    return value


def _usage(usage) -> dict:
    # Anthropic's three input counts are disjoint; OpenAI's prompt_tokens includes the cached ones.
    usage = usage if isinstance(usage, dict) else {}
    fresh, read, write = (_count(usage, k) for k in ("input_tokens", "cache_read_input_tokens",
                                                     "cache_creation_input_tokens"))
    out = _count(usage, "output_tokens")
    return {"prompt_tokens": fresh + read + write, "completion_tokens": out, "total_tokens": fresh + read + write + out,
            "prompt_tokens_details": {"cached_tokens": read},
            "cache_read_input_tokens": read, "cache_creation_input_tokens": write}


def chat_completion(message: dict) -> dict:
    """The OpenAI ``chat.completion`` for an Anthropic ``message`` (a ``tool_use`` block: its input as JSON text, as
    LiteLLM hands it back); ValueError if it is malformed or oversized.

    Example:
        >>> c = chat_completion({"id": "msg_1", "model": "claude-x", "stop_reason": "tool_use",
        ...     "content": [{"type": "tool_use", "name": "json_tool_call", "input": {"answer": "yes"}}],
        ...     "usage": {"input_tokens": 10, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 90,
        ...               "output_tokens": 5}})
        >>> c["choices"][0]["message"]["content"], c["choices"][0]["finish_reason"]
        ('{"answer": "yes"}', 'stop')
        >>> c["usage"]["prompt_tokens"], c["usage"]["prompt_tokens_details"], c["usage"]["cache_creation_input_tokens"]
        (1000, {'cached_tokens': 900}, 90)
    """
    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise ValueError("the message has no list of content blocks")
    tool = next((b for b in blocks if b.get("type") == "tool_use"), None)
    if tool is not None:
        text = json.dumps(tool.get("input"))
    else:
        parts = [b.get("text") for b in blocks if b.get("type") == "text"]
        if not all(isinstance(p, str) for p in parts):
            raise ValueError("a text block holds no string")
        text = "".join(parts)
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"the answer is {len(text)} characters long (more than {MAX_TEXT_CHARS})")
    model, ident = message.get("model"), message.get("id")
    return {"id": ident if isinstance(ident, str) else "", "object": "chat.completion", "created": int(time.time()),
            "model": model if isinstance(model, str) else "",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": _FINISH.get(message.get("stop_reason"), "stop")}],
            "usage": _usage(message.get("usage"))}


def _outcome(custom_id: str, result) -> Outcome | None:
    # None: the request did not finish (expired, canceled) and is to be submitted again.
    kind = result.get("type") if isinstance(result, dict) else None
    if kind in ("expired", "canceled"):
        return None
    if kind == "errored":  # Anthropic nests the error: {"type": "error", "error": {"type": ..., "message": ...}}
        inner = result.get("error").get("error") if isinstance(result.get("error"), dict) else None
        inner = inner if isinstance(inner, dict) else {}
        code = inner.get("type") if isinstance(inner.get("type"), str) else "api_error"
        return Outcome(custom_id, error={"status": ERROR_STATUS.get(code), "code": _short(code, 64),
                                         "message": _short(inner.get("message") or "")})
    if kind != "succeeded":
        return Outcome(custom_id, error={"status": None, "code": "bad_result",
                                         "message": f"unknown result type {_short(kind, 40)!r}"})
    try:
        return Outcome(custom_id, body=chat_completion(result.get("message")))
    except ValueError as exc:
        return Outcome(custom_id, error={"status": None, "code": "bad_result", "message": str(exc)})


class AnthropicBatches:
    """Anthropic's Message Batches API (``name = "anthropic"``).

    ``api_key`` (default ``ANTHROPIC_API_KEY``) is sent as ``x-api-key`` and shown nowhere else; ``base_url`` defaults
    to ``ANTHROPIC_BASE_URL``, else the public API. ``retries`` apply to reads only: a retried submission could
    submit the batch twice. ``max_results_bytes`` caps a download above ``limits.batch_result_bytes`` of its requests.

    Example:
        >>> AnthropicBatches(api_key="sk-ant-secret", base_url="http://127.0.0.1:9")
        AnthropicBatches(base_url='http://127.0.0.1:9')
    """

    name = "anthropic"

    def __init__(self, api_key: str | None = None, base_url: str | None = None, timeout: float = 60.0,
                 retries: int = 2, max_results_bytes: int = MAX_BATCH_RESULT_BYTES):
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ConfigError("Anthropic batches need an API key: set ANTHROPIC_API_KEY")
        base = (base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.base_url = base.removesuffix("/v1")  # a LiteLLM-style base ending in /v1 means the same API
        self.retries = max(0, retries)
        self.max_results_bytes = max_results_bytes
        self._client = httpx.Client(timeout=timeout, follow_redirects=False,
                                    headers={"x-api-key": key, "anthropic-version": API_VERSION})

    def __repr__(self) -> str:
        return f"AnthropicBatches(base_url={self.base_url!r})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AnthropicBatches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, requests: list[BatchRequest], label: str) -> str:
        """Submit ``requests`` as one batch; its id. ``label`` is not sent: Anthropic batches carry no metadata."""
        if not requests or len(requests) > MAX_BATCH_REQUESTS:
            raise ConfigError(f"an Anthropic batch holds 1 to {MAX_BATCH_REQUESTS} requests, not {len(requests)}")
        seen = set()
        for r in requests:
            if not isinstance(r.custom_id, str) or not _CUSTOM_ID.fullmatch(r.custom_id):
                raise ConfigError(f"custom_id {r.custom_id!r} is not 1-64 letters, digits, '_' or '-' "
                                  "(Anthropic refuses it)")
            if r.custom_id in seen:
                raise ConfigError(f"custom_id {r.custom_id!r} appears twice in one batch")
            seen.add(r.custom_id)
        payload = json.dumps({"requests": [{"custom_id": r.custom_id, "params": messages_params(r.body)}
                                           for r in requests]}).encode()
        if len(payload) > MAX_BATCH_BYTES:
            raise ConfigError(f"the batch is {len(payload)} bytes; Anthropic takes at most {MAX_BATCH_BYTES}")
        response = self._send("POST", f"{self.base_url}/v1/messages/batches", "(new)", retry=False,
                              content=payload, headers={"content-type": "application/json"})
        batch_id = self._json(response, "(new)").get("id")
        if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id):
            raise FatalLMError(f"Anthropic answered a batch submission without a usable id: {_short(batch_id, 80)!r}")
        return batch_id

    def find(self, label: str) -> str | None:
        """Always None: Anthropic batches carry no metadata, so a batch cannot be found by its label."""
        return None

    def state(self, batch_id: str) -> BatchState:
        """The batch's state; ``detail`` is Anthropic's ``processing_status`` (``canceling`` is still in progress)."""
        batch = self._batch(batch_id)
        status_word = batch.get("processing_status")
        counts = batch.get("request_counts") if isinstance(batch.get("request_counts"), dict) else {}
        n = {k: counts.get(k) if isinstance(counts.get(k), int) else 0
             for k in ("processing", "succeeded", "errored", "canceled", "expired")}
        if status_word == "ended":
            status = "expired" if n["expired"] else "cancelled" if n["canceled"] else "completed"
        elif status_word in ("in_progress", "canceling"):
            status = "in_progress"
        else:
            raise FatalLMError(f"Anthropic batch {batch.get('id')}: unknown processing_status {_short(status_word, 40)!r}")
        return BatchState(batch["id"], status, {"total": sum(n.values()), "completed": n["succeeded"],
                                                "failed": n["errored"]}, status_word)

    def outcomes(self, batch_id: str, asked: Collection[str]) -> list[Outcome]:
        """The ``BatchProvider`` outcomes: expired and canceled requests have none."""
        batch = self._batch(batch_id)
        url = batch.get("results_url")
        if batch.get("processing_status") != "ended" or not isinstance(url, str):
            raise FatalLMError(f"Anthropic batch {batch_id} has no results yet ({_short(batch.get('processing_status'))})")
        if urlsplit(url)[:2] != urlsplit(self.base_url)[:2]:
            # The key goes with the download: only to the API's own host.
            raise FatalLMError(f"Anthropic batch {batch_id}: results_url {_short(url, 120)!r} is not on {self.base_url}")
        return self._results(url, batch_id, asked)

    def _batch(self, batch_id: str) -> dict:
        if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id):
            raise FatalLMError(f"{_short(batch_id, 80)!r} is not an Anthropic batch id")
        batch = self._json(self._send("GET", f"{self.base_url}/v1/messages/batches/{batch_id}", batch_id), batch_id)
        if batch.get("id") != batch_id:
            raise FatalLMError(f"Anthropic answered for batch {_short(batch.get('id'), 80)!r} when asked for {batch_id}")
        return batch

    @staticmethod
    def _parse_line(line: bytes, batch_id: str, number: int) -> tuple[str, object]:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        custom_id = row.get("custom_id") if isinstance(row, dict) else None
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            raise FatalLMError(f"Anthropic batch {batch_id} results line {number} is not a JSON object with a custom_id")
        return custom_id, row.get("result")

    def _send(self, method: str, url: str, batch_id: str, retry: bool = True, **kwargs) -> httpx.Response:
        """The response to one call (2xx); FatalLMError naming the status and batch otherwise."""
        def once() -> tuple[httpx.Response, httpx.Response]:
            response = self._client.request(method, url, **kwargs)
            return response, response

        return self._tried(once, self.retries + 1 if retry else 1, f"Anthropic batch {batch_id}: {method}", True)

    def _tried(self, once: Callable[[], tuple[httpx.Response, object]], tries: int, what: str, say_error: bool):
        """What ``once()`` gave with a 2xx response, trying again after a transient fault (``_RETRY_STATUS``, no
        connection); a FatalLMError saying ``what`` failed otherwise (and the HTTP error, when ``say_error``)."""
        for attempt in range(tries):
            if attempt:
                time.sleep(0.5 * 2**attempt)
            try:
                response, value = once()
            except httpx.HTTPError as exc:
                fault = FatalLMError(f"{what} failed: {type(exc).__name__}" + (f": {_short(exc)}" if say_error else ""))
                continue
            if response.is_success:
                return value
            fault = FatalLMError(f"{what} answered HTTP {response.status_code}: {_short(_error_message(response))}")
            if response.status_code not in _RETRY_STATUS:
                break
        raise fault

    def _json(self, response: httpx.Response, batch_id: str) -> dict:
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise FatalLMError(f"Anthropic batch {batch_id}: the API answered something other than a JSON object")
        return data

    def _results(self, url: str, batch_id: str, asked: Collection[str]) -> list[Outcome]:
        """The outcomes in the results file, read as it streams in, refusing more than the cap in all."""
        cap = min(self.max_results_bytes, batch_result_bytes(len(asked)))
        where = f"Anthropic batch {batch_id} results"

        def once() -> tuple[httpx.Response, list[Outcome] | None]:
            with self._client.stream("GET", url) as response:
                if not response.is_success:
                    response.read()  # an error body, read only to report it
                    return response, None
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise FatalLMError(f"{where} are {declared} bytes, over the {cap}-byte cap for the batch's requests")
                lines = ((number, *self._parse_line(line, batch_id, number))
                         for number, line in capped_lines(response.iter_bytes(), cap, where))
                return response, asked_outcomes(lines, asked, where, _outcome)

        return self._tried(once, self.retries + 1, f"Anthropic batch {batch_id}: results download", False)


def _error_message(response: httpx.Response) -> str:
    try:
        inner = response.json().get("error") or {}
        return f"{inner.get('type')}: {inner.get('message')}"
    except (ValueError, AttributeError):
        return response.text[:300]
