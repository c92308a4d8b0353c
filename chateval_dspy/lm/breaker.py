"""A circuit breaker per endpoint: after ``threshold`` failed attempts in a row the run stops with one ``FatalLMError``.

What counts as a failure, 429s (``RateLimited``) and the figures: docs/reliability.md. This package's engines count
each of their attempts; a DSPy-engine LM (a LiteLLM model string) is out of sight while it runs, so its
``BreakerWatch`` counts each failed call's ``1 + num_retries`` attempts and ``Watch`` one per ``timeout`` of silence
(not while the endpoint rate-limits). Such an LM has no liveness check.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Callable, Iterable

import dspy
from dspy import lm15
from dspy.utils.callback import BaseCallback

from chateval_dspy.errors import FatalLMError, cause_of
from chateval_dspy.lm.bound import referee_lms
from chateval_dspy.lm.call_limits import (
    DEFAULT_BREAKER,
    DEFAULT_RATE_LIMIT_WAIT,
    RATE_LIMIT_PAUSE_CAP_S,
    check_rate_limit_wait,
    check_threshold,
)

_BREAKER_ATTR = "_chateval_breaker"
# What a DSPy-engine LM did when all the debate saw was silence: DSPy's attempts and retries are out of sight.
SILENCE = "no answer"
TIMED_OUT = "timed out"
# How long one liveness check's answer stands: the calls that time out together ask once.
PROBE_TTL_S = 1.0


class RateLimited(FatalLMError):  # noqa: N818 - named after what happened, like BudgetExceeded
    """An endpoint answered only 429s for longer than the run may wait: the run stops, the rate-limited items unrecorded."""


def _seconds(value: float) -> str:
    """Seconds as a message says them: whole ones from 10 on, tenths below."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def failure_kind(exc: BaseException | None) -> str | None:
    """How the endpoint failed in ``exc`` (DSPy's wrapping looked through), or None when it is not the endpoint's fault
    (no HTTP answer is: a 5xx may be one request's, a 4xx is the request's fault).

    Example:
        >>> failure_kind(lm15.TimeoutError("slow")), failure_kind(lm15.ServerError("down", status=503))
        ('timed out', None)
        >>> failure_kind(lm15.TransportError("refused")), failure_kind(lm15.RateLimitError("busy", status=429))
        ('no connection', None)
    """
    if cause_of(exc, TimeoutError) is not None:  # lm15's timeouts and the sockets' alike
        return TIMED_OUT
    if cause_of(exc, lm15.TransportError) is not None or cause_of(exc, ConnectionError) is not None:
        return "no connection"
    return None


class Breaker:
    """One endpoint's failed attempts in a row; at ``threshold`` it opens and every call fails with one ``FatalLMError``.
    Copies of its LM share it (optimizers copy LMs): one endpoint, one count. ``endpoint`` names it in messages; with
    ``alive`` (its liveness check) a timeout counts only when the check fails too, else ``on_slow`` hears of it.

    Example:
        >>> b = Breaker("http://127.0.0.1:9/v1", threshold=2)
        >>> b.failed("timed out"), b.succeeded(), b.failed("timed out")
        (None, None, None)
        >>> print(b.failed("no connection"))
        the endpoint http://127.0.0.1:9/v1 failed 2 attempts in a row (timed out, no connection): stopping the run; ...
        >>> b.check()
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.FatalLMError: the endpoint http://127.0.0.1:9/v1 failed 2 attempts in a row ...
    """

    def __init__(self, endpoint: str, threshold: int = DEFAULT_BREAKER, *, alive: Callable[[], bool] | None = None,
                 on_slow: Callable[[], None] | None = None, rate_limit_wait: float = DEFAULT_RATE_LIMIT_WAIT):
        self.endpoint, self.threshold = endpoint, check_threshold(threshold)
        self.alive, self.on_slow = alive, on_slow
        self.rate_limit_wait = check_rate_limit_wait(rate_limit_wait)
        self.failures = 0
        self.slow = 0  # timeouts a live endpoint let happen: not failures
        self._limited_since: float | None = None  # the first 429 of the current run of them
        self._probe: tuple[float, bool] | None = None  # (when, answer) of the last liveness check
        self._probe_lock = threading.Lock()
        self._kinds: dict[str, None] = {}  # this streak's kinds of failure, in order
        self._message: str | None = None
        self._kind: type[FatalLMError] = FatalLMError  # ``trip`` may open it with a subclass (a gateway's spent budget)
        self._waiters: set[threading.Event] = set()
        self._lock = threading.Lock()

    def __copy__(self) -> Breaker:
        return self

    def __deepcopy__(self, memo) -> Breaker:
        return self

    def error(self) -> FatalLMError | None:
        """The error every call now fails with, or None while the breaker is closed."""
        return None if self._message is None else self._kind(self._message)

    def check(self) -> None:
        """Raise the breaker's ``FatalLMError`` once it is open (a call about to start fails at once)."""
        stop = self.error()
        if stop is not None:
            raise stop

    def succeeded(self) -> None:
        """The endpoint answered: the count starts again (an open breaker stays open: the run is stopping)."""
        with self._lock:
            self.failures = 0
            self._kinds.clear()
            self._limited_since = None

    def answers(self) -> bool:
        """Whether the endpoint passes its liveness check now (asked at most once a ``PROBE_TTL_S``)."""
        with self._probe_lock:
            now = time.monotonic()
            if self._probe is None or now - self._probe[0] > PROBE_TTL_S:
                try:
                    live = bool(self.alive())
                except Exception:  # a check that cannot run says nothing is alive
                    live = False
                self._probe = (time.monotonic(), live)
            return self._probe[1]

    def failed(self, kind: str, attempts: int = 1) -> FatalLMError | None:
        """Count ``attempts`` failed attempts of ``kind``; the ``FatalLMError`` to raise once open, else None. A timeout
        does not count while ``alive`` passes: ``on_slow`` hears of it."""
        if kind == TIMED_OUT and self.alive is not None and self._message is None and self.answers():
            with self._lock:
                self.slow += attempts
            if self.on_slow is not None:
                self.on_slow()
            return None
        with self._lock:
            self.failures += attempts
            self._kinds[kind] = None
            if self.failures >= self.threshold:
                self._open(FatalLMError(f"the endpoint {self.endpoint} failed {self.failures} attempts in a row "
                                        f"({', '.join(self._kinds)}): stopping the run; finished results are kept, "
                                        "rerun the same command to resume"))
        return self.error()

    def _open(self, error: FatalLMError) -> None:
        """Open with ``error`` unless already open (under ``_lock``); calls in flight stop waiting."""
        if self._message is None:
            self._message, self._kind = str(error), type(error)
            for waiter in self._waiters:
                waiter.set()

    def trip(self, error: FatalLMError) -> FatalLMError:
        """Open at once with ``error`` (what retrying cannot change, e.g. a spent budget); returns the error to raise
        (the first one's, when already open).

        Example:
            >>> b = Breaker("http://127.0.0.1:9/v1")
            >>> b.trip(FatalLMError("budget spent")) is not None, b.failures
            (True, 0)
            >>> b.check()
            Traceback (most recent call last):
            ...
            chateval_dspy.errors.FatalLMError: budget spent
        """
        with self._lock:
            self._open(error)
        return self.error()

    @property
    def limiting(self) -> bool:
        """Whether the endpoint's last word was a 429 (no answer since)."""
        return self._limited_since is not None

    def rate_limited(self, pause: float, asked: float | None = None) -> float:
        """A 429: seconds to wait (``pause`` capped by ``RATE_LIMIT_PAUSE_CAP_S`` and what is left of
        ``rate_limit_wait``); ``RateLimited`` once that is spent or the Retry-After ``asked`` is longer than what is left.

        Example:
            >>> b = Breaker("http://127.0.0.1:9/v1", rate_limit_wait=240)
            >>> b.rate_limited(2.0), b.rate_limited(600.0)  # a long wait is made in steps of RATE_LIMIT_PAUSE_CAP_S
            (2.0, 60.0)
            >>> b.rate_limited(5.0, asked=86400)
            Traceback (most recent call last):
            ...
            chateval_dspy.lm.breaker.RateLimited: the endpoint http://127.0.0.1:9/v1 is rate limiting (HTTP 429): ...
        """
        now = time.monotonic()
        with self._lock:
            if self._limited_since is None:
                self._limited_since = now
            spent = now - self._limited_since
        left = self.rate_limit_wait - spent
        if left <= 0 or (asked is not None and asked > left):
            raise self.stop_rate_limited(spent, asked)
        return max(0.0, min(pause, RATE_LIMIT_PAUSE_CAP_S, left))

    def stop_rate_limited(self, spent: float | None = None, asked: float | None = None, why: str = "") -> FatalLMError:
        """Open the breaker with ``RateLimited``, saying for how long the endpoint rate-limited; returns the error."""
        if spent is None:
            spent = 0.0 if self._limited_since is None else time.monotonic() - self._limited_since
        said = f"; it asks to wait {_seconds(asked)} s (Retry-After)" if asked is not None else ""
        return self.trip(RateLimited(
            f"the endpoint {self.endpoint} is rate limiting (HTTP 429): only 429s for {_seconds(spent)} s{said}{why}, "
            f"and the run waits at most {_seconds(self.rate_limit_wait)} s (rate_limit_wait): stopping the run; finished "
            "results are kept and the rate-limited items were not recorded: rerun the same command once the limit "
            "resets"))

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the breaker opens meanwhile (then its error)."""
        event = threading.Event()
        self.wake(event)
        try:
            event.wait(seconds)
        finally:
            self.forget(event)
        self.check()

    def wake(self, event: threading.Event) -> None:
        """Set ``event`` when the breaker opens (at once if it is open)."""
        with self._lock:
            self._waiters.add(event)
            if self._message is not None:
                event.set()

    def forget(self, event: threading.Event) -> None:
        with self._lock:
            self._waiters.discard(event)


def breaker_of(lm) -> Breaker | None:
    """The breaker of an LM: its engine's (``lm.engine``'s engines), else the one ``with_breaker`` gave it."""
    found = getattr(getattr(lm, "engine", None), "breaker", None)
    found = found if isinstance(found, Breaker) else getattr(lm, _BREAKER_ATTR, None)
    return found if isinstance(found, Breaker) else None


def context_breakers() -> list[Breaker]:
    """The breakers of the LMs in the current DSPy context: the main LM's and a mixed panel's referees'."""
    found = (breaker_of(lm) for lm in (dspy.settings.lm, *referee_lms().values()))
    return list({id(b): b for b in found if b is not None}.values())


_ACTIVE: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("chateval_watch", default=None)


class Watch:
    """One LM call's wait (``within_deadline``), ending with the call or when a breaker opens. Each ``tick`` seconds
    of silence (the ``timeout``, where DSPy's attempt ends) is one failed attempt of the DSPy-engine LMs reached."""

    def __init__(self, breakers: Iterable[Breaker], tick: float | None = None):
        self.breakers, self.tick = list(breakers), tick
        self.watched: list[Breaker] = []  # DSPy-engine LMs the call reached (their BreakerWatch adds them)
        self.inner_retries = 0  # the most num_retries of those LMs: DSPy retried their calls itself
        self.ticks, self.closed = 0, False
        self.done = threading.Event()
        self.value, self.error = None, None
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def __enter__(self) -> Watch:
        for breaker in self.breakers:
            breaker.wake(self.done)
        return self

    def __exit__(self, *exc) -> None:
        self.closed = True
        for breaker in {*self.breakers, *self.watched}:
            breaker.forget(self.done)

    def call(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the call's thread (in its copied context), keeping its value or error."""
        _ACTIVE.set(self)
        try:
            self.value = fn()
        except BaseException as exc:  # handed to the waiting thread as it is
            self.error = exc
        finally:
            self.done.set()

    def use(self, breaker: Breaker) -> None:
        """The call reached an LM whose breaker counts on this watch (``BreakerWatch``)."""
        with self._lock:
            if breaker not in self.watched:
                self.watched.append(breaker)
                breaker.wake(self.done)

    def wait(self, seconds: float) -> bool:
        """Whether the call ended within ``seconds``; the ``FatalLMError`` of a breaker that opened meanwhile."""
        end = time.monotonic() + seconds
        while not self.done.wait(max(0.0, self._next(end) - time.monotonic())):
            now = time.monotonic()
            if now >= end:
                break
            if now >= self._next(math.inf):  # an attempt's worth of silence: DSPy's own attempt timed out
                self.ticks += 1
                for breaker in self._silent():
                    breaker.failed(SILENCE)
        if not self.done.is_set() and self.watched and self.ticks == 0:
            for breaker in self._silent():  # cut before one full attempt: the call's first attempt failed
                breaker.failed(SILENCE)
        stop = next(filter(None, (b.error() for b in [*self.breakers, *self.watched])), None)
        if stop is not None:
            raise stop from self.error
        return self.done.is_set()

    def _silent(self) -> list[Breaker]:
        """The watched breakers whose silence counts: not while their endpoint rate-limits (DSPy sleeps out a 429)."""
        return [b for b in list(self.watched) if not b.limiting]

    def _next(self, end: float) -> float:
        """When to look next: the end, or sooner the next tick."""
        return end if self.tick is None else min(end, self._started + (self.ticks + 1) * self.tick)


class BreakerWatch(BaseCallback):
    """Counts a DSPy-engine LM's failed attempts for its breaker: ``1 + num_retries`` per failed call, less those
    its ``Watch`` counted for silence (``with_breaker`` attaches it)."""

    def __init__(self, breaker: Breaker):
        self.breaker = breaker
        self._calls: dict[str, tuple[Watch | None, int, int]] = {}

    def on_lm_start(self, call_id, instance, inputs) -> None:
        watch = _ACTIVE.get()
        retries = getattr(instance, "num_retries", 0) or 0
        if watch is not None:
            watch.use(self.breaker)
            watch.inner_retries = max(watch.inner_retries, retries)
        self._calls[call_id] = (watch, watch.ticks if watch else 0, 1 + retries)

    def on_lm_end(self, call_id, outputs, exception=None) -> None:
        watch, ticks, attempts = self._calls.pop(call_id, (None, 0, 1))
        if exception is None:
            self.breaker.succeeded()
            return
        kind = failure_kind(exception)
        if kind is None or (watch is not None and watch.closed):  # a closed watch counted this call already
            return
        left = attempts - (watch.ticks - ticks if watch is not None else 0)
        if left > 0:
            self.breaker.failed(kind, left)


def with_breaker(lm, breaker: Breaker):
    """Give an LM whose engine is DSPy's (a LiteLLM model string) ``breaker``; returns ``lm``, whose copies share it."""
    setattr(lm, _BREAKER_ATTR, breaker)
    lm.callbacks = [*(getattr(lm, "callbacks", None) or []), BreakerWatch(breaker)]
    return lm
