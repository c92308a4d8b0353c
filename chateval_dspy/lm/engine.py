"""A DSPy engine for any OpenAI-compatible chat server (the embedded one, vLLM, Ollama, llama.cpp).

It speaks the wire through the ``openai`` client, whose retries with backoff
handle timeouts, 429s and 5xx; what still fails is translated into DSPy's lm15
errors so that the debate can record it as an abstention.
"""

from __future__ import annotations

import copy
import threading

import openai
from dspy import lm15
from dspy.lm15 import Message, Response, TextPart, TokenLogprob, TopLogprob, Usage, response_to_events

from chateval_dspy.errors import LMError


def _text(system) -> str:
    return system if isinstance(system, str) else "".join(getattr(p, "text", "") for p in system)


def _message(m) -> dict:
    return {"role": m.role, "content": m.text or ""}


class OpenAICompatEngine:
    """``dspy.LM(model, engine=OpenAICompatEngine(...))`` for a chat-completions server.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: The served model's id.
        api_key: Sent as a bearer token; never logged or saved (this engine has no ``dump_state``).
        timeout: Seconds per request before it counts as failed.
        max_retries: The ``openai`` client's retries with exponential backoff.
        compact_json: llama.cpp only: forbid free whitespace in constrained JSON and cap
            string lengths, so that a tiny model cannot pad its output until ``max_tokens``.
        max_string_chars: With ``compact_json``, the longest string a JSON field may hold.
    """

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "top_p", "stop", "seed", "logprobs",
                                  "top_logprobs"})

    def __init__(self, base_url: str, model: str, api_key: str = "none", *, timeout: float = 120.0,
                 max_retries: int = 3, compact_json: bool = False, max_string_chars: int = 600):
        self.base_url, self.model = base_url, model
        self.compact_json, self.max_string_chars = compact_json, max_string_chars
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)

    def __repr__(self) -> str:  # keeps the key out of any repr that reaches a log
        return f"OpenAICompatEngine(base_url={self.base_url!r}, model={self.model!r})"

    def _response_format(self, fmt: dict) -> dict:
        if fmt.get("type") != "json_schema" or "schema" not in fmt:
            return fmt
        schema = copy.deepcopy(fmt["schema"])
        if self.compact_json:
            for prop in schema.get("properties", {}).values():
                if prop.get("type") == "string":
                    prop.setdefault("maxLength", self.max_string_chars)
            # llama.cpp compiles schemas with llguidance, which otherwise lets a model emit endless whitespace.
            schema["x-guidance"] = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
        return {"type": "json_schema",
                "json_schema": {"name": fmt.get("name", "output"), "schema": schema, "strict": bool(fmt.get("strict", True))}}

    def request_body(self, request) -> dict:
        """The chat-completions body for a DSPy request (public so tests can check the wire)."""
        messages = ([{"role": "system", "content": _text(request.system)}] if request.system else [])
        messages += [_message(m) for m in request.messages]
        cfg = request.config
        body = {"model": self.model, "messages": messages}
        for name in ("temperature", "max_tokens", "top_p", "seed"):
            if getattr(cfg, name) is not None:
                body[name] = getattr(cfg, name)
        if cfg.stop:
            body["stop"] = list(cfg.stop)
        if cfg.response_format:
            body["response_format"] = self._response_format(dict(cfg.response_format))
        if cfg.logprobs is not None:
            body["logprobs"] = True
            if cfg.logprobs > 0:
                body["top_logprobs"] = cfg.logprobs
        return body

    def complete(self, request) -> Response:
        try:
            r = self.client.chat.completions.create(**self.request_body(request))
        except openai.APITimeoutError as exc:
            raise lm15.TimeoutError(f"{self.base_url}: request timed out", provider="openai-compatible") from exc
        except openai.APIConnectionError as exc:
            raise lm15.TransportError(f"{self.base_url}: cannot connect ({exc})") from exc
        except openai.RateLimitError as exc:
            raise lm15.RateLimitError(f"{self.base_url}: rate limited", status=429) from exc
        except openai.AuthenticationError as exc:
            raise lm15.AuthError(f"{self.base_url}: authentication failed; check the API key variable",
                                 status=exc.status_code) from exc
        except openai.BadRequestError as exc:
            cls = lm15.ContextLengthError if "context" in str(exc).lower() else lm15.InvalidRequestError
            raise cls(f"{self.base_url}: {exc.message}", status=400) from exc
        except openai.APIStatusError as exc:
            raise lm15.ServerError(f"{self.base_url}: HTTP {exc.status_code}", status=exc.status_code) from exc
        if not r.choices:
            raise lm15.ServerError(f"{self.base_url}: response had no choices")
        choice = r.choices[0]
        finish = choice.finish_reason if choice.finish_reason in ("stop", "length", "content_filter") else "stop"
        usage = r.usage
        content = getattr(choice.logprobs, "content", None) if choice.logprobs else None
        logprobs = None if not content else tuple(
            TokenLogprob(t.token, float(t.logprob), top=tuple(TopLogprob(a.token, float(a.logprob))
                                                              for a in (t.top_logprobs or ())))
            for t in content if t.token)
        return Response(
            id=r.id, model=r.model or self.model, finish_reason=finish, logprobs=logprobs,
            message=Message.assistant([TextPart(choice.message.content or "")]),
            usage=Usage(input_tokens=usage.prompt_tokens if usage else 0,
                        output_tokens=usage.completion_tokens if usage else 0,
                        total_tokens=usage.total_tokens if usage else 0),
        )

    def stream(self, request):
        return response_to_events(self.complete(request))

    def close(self) -> None:
        self.client.close()


class RestartingEngine(OpenAICompatEngine):
    """An engine for a server this process owns: when it stops answering, restart it once.

    Args:
        restart: Restarts the server and returns its new base URL.

    A second loss is fatal: ``complete`` raises ``chateval_dspy.errors.LMError``, which the
    debate re-raises instead of recording abstentions for every remaining item.
    """

    def __init__(self, base_url: str, model: str, *, restart, **kwargs):
        super().__init__(base_url, model, **kwargs)
        self._restart, self.restarts = restart, 0
        self._lock = threading.Lock()

    def complete(self, request) -> Response:
        failed_url = self.base_url
        try:
            return super().complete(request)
        except lm15.TransportError as exc:
            with self._lock:
                if self.base_url == failed_url:  # no other thread restarted it meanwhile
                    if self.restarts >= 1:
                        raise LMError(f"the model server at {failed_url} died again after a restart; giving up "
                                      "(check memory, or run with --concurrency 1)") from exc
                    self.restarts += 1
                    self.base_url = self._restart()
                    self.client = openai.OpenAI(base_url=self.base_url, api_key=self.client.api_key,
                                                timeout=self.client.timeout, max_retries=self.client.max_retries)
            return super().complete(request)
