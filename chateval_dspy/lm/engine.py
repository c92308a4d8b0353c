"""A DSPy engine for any OpenAI-compatible chat server (the embedded one, vLLM, Ollama, llama.cpp), and the time
bounds every LM call of a judged item lives under (``lm.call_limits.CallBounds``).

Retries happen in exactly one layer: these engines for base URLs (the ``openai`` client's own are off), else
``within_deadline`` (DSPy's ``num_retries`` is 0 everywhere: its loop sleeps out any Retry-After unseen). Deadlines,
the breaker, 429s, gateway budgets and redirects: docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import itertools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import dspy
import httpx
import openai
from dspy import lm15
from dspy.lm15 import Message, Response, TextPart, TokenLogprob, TopLogprob, Usage, response_to_events
from dspy.utils.exceptions import LMError, LMRateLimitError, is_retryable_lm_error

from chateval_dspy.concurrency import set_within
from chateval_dspy.errors import BudgetExceeded, FatalLMError, cause_of
from chateval_dspy.lm import tags
from chateval_dspy.lm.breaker import Breaker, Watch, context_breakers, failure_kind
from chateval_dspy.lm.call_limits import (
    DEFAULT_BREAKER,
    DEFAULT_RATE_LIMIT_WAIT,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    CallBounds,
    Pace,
)

R = TypeVar("R")
log = logging.getLogger(__name__)

DEADLINE_CAUSE = "lm_error:deadline"
# Slack the watchdog leaves an engine that enforces the same deadline itself, so that the engine's
# own error (its socket already closed) normally arrives first.
WATCHDOG_GRACE_S = 0.25
# Exponential backoff between attempts: 0.5 s, 1 s, 2 s ... at most 8 s (a server's Retry-After wins).
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.5, 8.0
# The longest a liveness check may take (shorter when the stated timeout is).
PROBE_TIMEOUT_S = 5.0


class DeadlineExceeded(lm15.TimeoutError):  # noqa: N818 - named after what happened, like TimeoutError
    """A call ran out of its call deadline or its item's deadline (``started`` False: before any request was sent)."""

    def __init__(self, message: str, *, started: bool = True, **kwargs):
        super().__init__(message, **kwargs)
        self.started = started


def deadline_in(exc: BaseException | None) -> DeadlineExceeded | None:
    """The ``DeadlineExceeded`` behind ``exc`` (DSPy wraps engine errors in its own), or None."""
    return cause_of(exc, DeadlineExceeded)


# Absolute ``time.monotonic()`` ends. Contextvars, so that worker threads that copy the context
# (``concurrency.parallel_map``) keep the item's deadline.
_ITEM_END: contextvars.ContextVar[float | None] = contextvars.ContextVar("chateval_item_end", default=None)
_CALL_END: contextvars.ContextVar[float | None] = contextvars.ContextVar("chateval_call_end", default=None)
_BOUNDS_ATTR = "_chateval_bounds"


def bounds_of(lm) -> CallBounds | None:
    """The bounds an LM was built with: its engine's (this module's engines), else those ``with_bounds`` gave it."""
    found = getattr(getattr(lm, "engine", None), "bounds", None)
    found = found if isinstance(found, CallBounds) else getattr(lm, _BOUNDS_ATTR, None)
    return found if isinstance(found, CallBounds) else None


def with_bounds(lm, bounds: CallBounds):
    """Give an LM whose engine cannot enforce deadlines (a LiteLLM model string, a hand-built ``dspy.LM``)
    the bounds that the debate then enforces around each of its calls. Returns ``lm``; copies keep them."""
    setattr(lm, _BOUNDS_ATTR, bounds)
    return lm


def item_scope(bounds: CallBounds | None) -> contextlib.AbstractContextManager:
    """The time of one judged item: every call inside ends by ``item_deadline`` from now (``ChatEval`` enters it)."""
    outer = _ITEM_END.get()
    return set_within(_ITEM_END, outer if bounds is None else min(outer or math.inf, time.monotonic() + bounds.item_deadline))


def call_end(bounds: CallBounds | None) -> float:
    """When a call starting now must be over: the earliest of its own deadline, an enclosing call's and the item's."""
    ends = [time.monotonic() + bounds.call_deadline] if bounds is not None else []
    ends += [end for end in (_CALL_END.get(), _ITEM_END.get()) if end is not None]
    return min(ends, default=math.inf)


def within_deadline(fn: Callable[[], R], bounds: CallBounds | None) -> R:
    """``fn()``, but never waiting past the call's or the item's deadline: then ``DeadlineExceeded``.

    ``fn`` runs on a daemon thread so the caller regains control at the deadline even when the LM cannot be
    interrupted; an open breaker of an LM in the context fails the call with its ``FatalLMError``, before or during
    it. A model-string LM makes one attempt a call, so its retries (``_retry_pause``) and 429 waits (``_wait_out``)
    are made here, within the one call deadline.
    """
    breakers = context_breakers()
    for breaker in breakers:  # an endpoint already given up on: fail before sending anything
        breaker.check()
    end = call_end(bounds)
    if end == math.inf or dspy.settings.send_stream is not None:  # a streaming caller needs its own thread
        return fn()
    limited = attempt = 0
    while True:
        watch = _watched_call(fn, bounds, breakers, end)
        if watch.error is None:
            return watch.value
        if not watch.watched or isinstance(watch.error, FatalLMError):
            raise watch.error
        said = cause_of(watch.error, lm15.RateLimitError) or cause_of(watch.error, LMRateLimitError)
        if said is not None:
            _wait_out(watch.watched, getattr(said, "retry_after", None), limited, end, watch.error)
            limited += 1
            continue
        pause = _retry_pause(watch, bounds, attempt, end)
        if pause is None:
            raise watch.error
        watch.watched[0].pause(pause)
        attempt += 1


def _backoff(attempt: int) -> float:
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** attempt)


def _wait_out(breakers: list[Breaker], hint: float | None, limited: int, end: float, error: Exception) -> None:
    """Wait before asking again after a call's ``limited``-th 429 in a row: its Retry-After (``hint``), else a
    backoff, as the breakers allow (``Breaker.rate_limited`` raises ``RateLimited`` once the endpoint has rate-limited
    too long); a wait past the call's deadline ``end`` stops the run too, as the call may not become an abstention."""
    for breaker in breakers:
        pause = breaker.rate_limited(_backoff(limited) if hint is None else hint, hint)
    if time.monotonic() + pause >= end:
        raise breakers[0].stop_rate_limited(asked=hint, why=", until this call's deadline") from error
    breakers[0].pause(pause)


def _retry_pause(watch: Watch, bounds: CallBounds | None, attempt: int, end: float) -> float | None:
    """The backoff before retrying a DSPy-engine LM's failed call here, or None: not when DSPy retried it already
    (an LM built with ``num_retries``), the error is not transient, the retries are spent or the deadline is near."""
    failed = cause_of(watch.error, LMError)
    if bounds is None or watch.inner_retries or attempt >= bounds.retries or failed is None \
            or not is_retryable_lm_error(failed):
        return None
    pause = _backoff(attempt)
    return pause if time.monotonic() + pause < end else None


def _watched_call(fn: Callable[[], R], bounds: CallBounds | None, breakers: list[Breaker], end: float) -> Watch:
    """One run of ``fn`` until the call's deadline ``end``; the finished ``Watch`` (its value or error)."""
    left = end - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("deadline: the item's time was spent before this call", started=False)
    context = contextvars.copy_context()
    context.run(_CALL_END.set, end)
    with Watch(breakers, tick=bounds.timeout if bounds is not None else None) as watch:
        threading.Thread(target=context.run, args=(watch.call, fn), name="chateval-lm-call", daemon=True).start()
        answered = watch.wait(left + WATCHDOG_GRACE_S)
    if not answered:
        limiting = [b for b in (*breakers, *watch.watched) if b.limiting]
        if limiting:  # the time went on 429s: no item's fault, so no abstention
            raise limiting[0].stop_rate_limited(why=", until a call's deadline")
        raise DeadlineExceeded(f"deadline: no answer within {left:.1f} s")
    return watch


# Where a server says how long to wait: the standard header, then the LiteLLM proxy's copy of its router's or
# upstream's (``llm_provider-`` prefixed: its own rpm/tpm limit's 429 carries only that one), in seconds.
RETRY_AFTER_HEADERS = ("retry-after", "llm_provider-retry-after")
# A gateway's spent budget, as its error says it: LiteLLM's key/team/user budgets (type ``budget_exceeded``, HTTP 400,
# 422 or 429 by version) and its router's deployment and provider budgets (HTTP 429, "crossed budget").
_BUDGET_TEXT = re.compile(r"crossed budget|exceeded budget|budget has been exceeded|budget_exceeded", re.I)


def _retry_after(exc: openai.APIStatusError) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    for name in RETRY_AFTER_HEADERS:
        try:
            value = float(headers.get(name, ""))
        except (AttributeError, TypeError, ValueError):
            continue
        if 0 <= value < math.inf:
            return value
    return None


def _budget_spent(exc: openai.APIError, base_url: str) -> BudgetExceeded | None:
    """A ``BudgetExceeded`` when ``exc`` is a gateway refusing calls because its budget is spent, else None."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in (400, 402, 403, 422, 429):
        return None
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    text = " ".join(str(v) for v in (error.get("type"), error.get("message"), exc.message) if v)
    if not _BUDGET_TEXT.search(text):
        return None
    said = " ".join(str(error.get("message") or exc.message).split())[:240]
    return BudgetExceeded(f"the gateway at {base_url} refused the call: its budget is spent (HTTP {exc.status_code}: "
                          f"{said}): stopping the run; finished results are kept, raise the budget (or wait for its "
                          "window to reset) and rerun the same command to resume")


def redirect_refused(endpoint: str, status: int, location) -> FatalLMError:
    """The error for an endpoint that answered with a redirect: it names the endpoint and where it sent us.

    Example:
        >>> print(redirect_refused("http://127.0.0.1:8000/v1", 307, "http://127.0.0.1:9999/v1/chat/completions"))
        the endpoint http://127.0.0.1:8000/v1 answered HTTP 307, a redirect to 'http://127.0.0.1:9999/v1/chat/completions': ...
    """
    where = " ".join(str(location).split())[:200] if location else "(no Location)"
    return FatalLMError(f"the endpoint {endpoint} answered HTTP {status}, a redirect to {where!r}: redirects are not "
                        "followed (nothing a server answers may choose where prompts and keys go): stopping the run; "
                        "point the run at the endpoint itself")


def endpoint_alive(base_url: str, api_key: str = "none", timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``/health`` answers 200, or, where there is none or it wants another key (401/403/404/405),
    ``/v1/models`` does. A redirect is no answer.

    Example:
        >>> endpoint_alive("http://127.0.0.1:9/v1", timeout=1)  # nothing listens on port 9
        False
    """
    base = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"}
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False, headers=headers) as client:
            status = client.get(base.removesuffix("/v1") + "/health").status_code
            if status in (401, 403, 404, 405):
                status = client.get(base + "/models").status_code
    except httpx.HTTPError:
        return False
    return status == 200


def _translate(exc: openai.APIError, base_url: str) -> Exception:
    """The lm15 error DSPy understands for an ``openai`` client error (anything unknown stays as it is); a spent
    gateway budget is our ``BudgetExceeded`` and a redirect a ``FatalLMError``, which stop the run."""
    spent = _budget_spent(exc, base_url)
    if spent is not None:
        return spent
    if isinstance(exc, openai.APIStatusError) and 300 <= exc.status_code < 400:
        return redirect_refused(base_url, exc.status_code, exc.response.headers.get("location"))
    if isinstance(exc, openai.APITimeoutError):
        return lm15.TimeoutError(f"{base_url}: request timed out", provider="openai-compatible")
    if isinstance(exc, openai.APIConnectionError):
        return lm15.TransportError(f"{base_url}: cannot connect ({exc})")
    if isinstance(exc, openai.RateLimitError):
        return lm15.RateLimitError(f"{base_url}: rate limited", status=429, retry_after=_retry_after(exc))
    if isinstance(exc, openai.AuthenticationError):
        return lm15.AuthError(f"{base_url}: authentication failed; check the API key variable", status=exc.status_code)
    if isinstance(exc, openai.BadRequestError):
        cls = lm15.ContextLengthError if "context" in str(exc).lower() else lm15.InvalidRequestError
        return cls(f"{base_url}: {exc.message}", status=400)
    if isinstance(exc, openai.APIStatusError):
        return lm15.ServerError(f"{base_url}: HTTP {exc.status_code}", status=exc.status_code,
                                retry_after=_retry_after(exc))
    return exc


def _tokens(answer) -> tuple[int, int]:
    """An answer's (prompt, completion) tokens, 0 where the server does not say."""
    usage = getattr(answer, "usage", None)
    return (getattr(usage, "prompt_tokens", 0) or 0), (getattr(usage, "completion_tokens", 0) or 0)


def _transient(error: Exception) -> bool:
    if isinstance(error, (lm15.TimeoutError, lm15.TransportError, lm15.RateLimitError)):
        return True
    # 408 and 409 are the statuses the openai client itself retries besides 429 and 5xx.
    return isinstance(error, lm15.ServerError) and error.status is not None and (
        error.status in (408, 409) or error.status >= 500)


class OpenAICompatEngine:
    """``dspy.LM(model, engine=OpenAICompatEngine(...), num_retries=0)`` for a chat-completions server.

    ``api_key`` is never logged or saved (no ``dump_state``). ``compact_json`` (llama.cpp only) forbids free whitespace
    in constrained JSON and caps strings at ``max_string_chars``, so a tiny model cannot pad until ``max_tokens``.
    ``breaker``/``rate_limit_wait`` configure the ``Breaker``; ``bounds`` are stretched by ``pace`` (``Pace``).
    """

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "top_p", "stop", "seed", "logprobs",
                                  "top_logprobs"})

    def __init__(self, base_url: str, model: str, api_key: str = "none", *, timeout: float = DEFAULT_TIMEOUT,
                 max_retries: int = DEFAULT_RETRIES, call_deadline: float | None = None,
                 item_deadline: float | None = None, compact_json: bool = False, max_string_chars: int = 600,
                 breaker: int = DEFAULT_BREAKER, rate_limit_wait: float = DEFAULT_RATE_LIMIT_WAIT):
        self.base_url, self.model = base_url, model
        self.compact_json, self.max_string_chars = compact_json, max_string_chars
        self.pace = Pace(CallBounds.derive(timeout, max_retries, call_deadline, item_deadline))
        self.breaker = Breaker(base_url, breaker, alive=self.alive, on_slow=self.pace.timed_out,
                               rate_limit_wait=rate_limit_wait)
        self.client = self._client(base_url, api_key)

    @property
    def bounds(self) -> CallBounds:
        """The stated bounds, stretched to the endpoint's measured speed."""
        return self.pace.bounds()

    def alive(self) -> bool:
        """Whether the endpoint passes its liveness check (``endpoint_alive``): the breaker asks after a timeout."""
        return endpoint_alive(self.base_url, self.client.api_key, min(PROBE_TIMEOUT_S, self.pace.stated.timeout))

    def _client(self, base_url: str, api_key: str) -> openai.OpenAI:
        # The client's own retries would multiply with this engine's; a redirect must not choose the endpoint.
        return openai.OpenAI(base_url=base_url, api_key=api_key, timeout=self.pace.stated.timeout, max_retries=0,
                             http_client=openai.DefaultHttpxClient(follow_redirects=False))

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
        system = request.system
        messages = [{"role": "system", "content": system if isinstance(system, str) else
                     "".join(getattr(p, "text", "") for p in system)}] if system else []
        messages += [{"role": m.role, "content": m.text or ""} for m in request.messages]
        cfg = request.config
        body = {"model": self.model, "messages": messages}
        body.update({n: getattr(cfg, n) for n in ("temperature", "max_tokens", "top_p", "seed") if getattr(cfg, n) is not None})
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
        return self._complete(request, call_end(self.bounds))

    def _complete(self, request, end: float) -> Response:
        """Attempts until one answers, the retries are spent, the deadline ``end`` (monotonic) comes, or the
        breaker opens (its ``FatalLMError``). A 429 is waited out (``_wait_out``) without spending a retry."""
        body, tags_header = self.request_body(request), tags.header()  # for a gateway's spend logs
        extra = {"extra_headers": tags_header} if tags_header else {}
        attempt = limited = 0
        while True:
            self.breaker.check()
            left = end - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"{self.base_url}: deadline reached after {attempt} attempt(s)",
                                       provider="openai-compatible", started=attempt > 0)
            timeout = self.bounds.timeout
            limit, started = min(timeout, left), time.monotonic()
            try:
                answer = self.client.chat.completions.create(**body, timeout=limit, **extra)
            except openai.APIError as exc:
                error = _translate(exc, self.base_url)
                if error is exc:
                    raise
                if isinstance(error, FatalLMError):  # a spent budget, a redirect: stop the run as an open breaker does
                    raise self.breaker.trip(error) from exc
                if isinstance(error, lm15.RateLimitError):
                    _wait_out([self.breaker], error.retry_after, limited, end, error)
                    limited += 1
                    continue
                self._failed(error, exc, limit < timeout, attempt)
                if attempt >= self.bounds.retries or not _transient(error):
                    raise error from exc
                hint = getattr(error, "retry_after", None)
                pause = _backoff(attempt) if hint is None else hint
                if time.monotonic() + pause >= end:
                    raise DeadlineExceeded(f"{self.base_url}: deadline reached before retry {attempt + 1} "
                                           f"({type(error).__name__})", provider="openai-compatible") from exc
                time.sleep(pause)
                attempt += 1
            else:
                self.breaker.succeeded()
                prompt, completion = _tokens(answer)
                self.pace.answered(time.monotonic() - started, prompt + completion,
                                   prompt + (body.get("max_tokens") or completion))
                return self._response(answer)

    def _failed(self, error: Exception, exc: Exception, cut: bool, attempt: int) -> None:
        """Tell the breaker of a failed attempt (raising its error once it opens); a timed-out attempt that the
        deadline cut short ends the call with ``DeadlineExceeded``."""
        cut = cut and isinstance(error, lm15.TimeoutError)
        # A cut attempt proves nothing about the endpoint, unless its call had no full attempt to prove it.
        if self._counts(error) and (not cut or attempt == 0):
            stop = self.breaker.failed(failure_kind(error))
            if stop is not None:
                raise stop from exc
        if cut:
            raise DeadlineExceeded(f"{self.base_url}: deadline reached during attempt {attempt + 1}",
                                   provider="openai-compatible") from exc

    def warm_up(self, tokens_asked: int) -> None:
        """One short timed request, so the pace starts from the endpoint's speed now (``tokens_asked``: the largest
        request's prompt plus ``max_tokens``). Never raises: a failed warm-up keeps the stated bounds."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "Answer with one word: ready?"}],
                "max_tokens": 16, "temperature": 0}
        started = time.monotonic()
        try:
            answer = self.client.chat.completions.create(**body, timeout=self.pace.stated.timeout)
        except openai.APITimeoutError:
            self.pace.timed_out()
            return
        except openai.APIError as exc:
            log.warning("%s: warm-up request failed (%s); keeping the stated time bounds", self.base_url, exc)
            return
        seconds = time.monotonic() - started
        self.pace.answered(seconds, sum(_tokens(answer)), tokens_asked)
        log.info("%s: warm-up took %.2f s; attempts may take %.0f s", self.base_url, seconds, self.bounds.timeout)

    def _counts(self, error: Exception) -> bool:
        """Whether ``error`` is the endpoint's failure, for the breaker."""
        return failure_kind(error) is not None

    def _response(self, r) -> Response:
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
                        total_tokens=usage.total_tokens if usage else 0,
                        # Part of prompt_tokens, as OpenAI counts them; None when the server does not say.
                        cache_read_tokens=getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)),
        )

    def stream(self, request):
        return response_to_events(self.complete(request))

    def close(self) -> None:
        self.client.close()


class RestartingEngine(OpenAICompatEngine):
    """An engine for a server this process owns: when it stops answering, ``restart()`` it once (returning the new
    base URL); a second loss is a ``FatalLMError``, which stops the run instead of costing every item an abstention."""

    def _counts(self, error: Exception) -> bool:
        # A lost server is restarted, and lost again it stops the run: only its silences are the breaker's.
        return not isinstance(error, lm15.TransportError) and super()._counts(error)

    def __init__(self, base_url: str, model: str, *, restart, **kwargs):
        super().__init__(base_url, model, **kwargs)
        self._restart, self.restarts = restart, 0
        self._lock = threading.Lock()

    def complete(self, request) -> Response:
        end = call_end(self.bounds)  # a restart spends the same call's time: the deadline still holds
        failed_url = self.base_url
        try:
            return self._complete(request, end)
        except lm15.TransportError as exc:
            with self._lock:
                if self.base_url == failed_url:  # no other thread restarted it meanwhile
                    if self.restarts >= 1:
                        raise FatalLMError(f"the model server at {failed_url} died again after a restart; giving up "
                                      "(check memory, or run with --concurrency 1)") from exc
                    self.restarts += 1
                    new_url = self._restart()
                    # The client first: a thread that reads the new URL must not send through the old client.
                    self.client = self._client(new_url, self.client.api_key)
                    self.base_url = new_url
            return self._complete(request, end)


def _dead_failures(bounds) -> Iterator[float]:
    """When a dead endpoint's attempts fail, for one call after another as ``OpenAICompatEngine`` makes them."""
    t = 0.0
    while True:
        end, attempt = t + bounds.call_deadline, 0
        while True:
            if end - t < bounds.timeout:  # the deadline cuts this attempt: it counts only as the call's first
                t = end
                if attempt == 0:
                    yield t
                break
            t += bounds.timeout
            yield t
            pause = _backoff(attempt)
            if attempt >= bounds.retries or t + pause >= end:
                break
            t, attempt = t + pause, attempt + 1


def dead_endpoint_stop(bounds, streams: int = 2) -> float:
    """Seconds until a dead endpoint (it takes each request and never answers) opens the breaker, with ``streams``
    calls in flight at once (2: the default panel's two answer orders), each stream's calls one after another.

    Example:
        >>> bounds = CallBounds.derive()  # the defaults: timeout 120 s, 2 retries, call deadline 250 s
        >>> dead_endpoint_stop(bounds), 2 * bounds.call_deadline, dead_endpoint_stop(bounds, streams=1)
        (240.5, 500.0, 490.5)
    """
    nth = math.ceil(DEFAULT_BREAKER / streams)  # the streams fail in step
    return next(itertools.islice(_dead_failures(bounds), nth - 1, None))
