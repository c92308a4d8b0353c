"""A circuit breaker per endpoint: after ``threshold`` failed attempts in a row the run stops with one ``FatalLMError``.

Without it an endpoint that takes connections and never answers costs every item its full deadlines, and a
1,000-item run would take days to finish with nothing. An attempt counts as failed when the endpoint failed it:
it went unanswered for the whole ``timeout``, or its connection was refused or lost. Any HTTP answer does not
count: a 5xx may be one request's (a live server's retries and abstentions handle it, as they always did), a 4xx
is the request's fault, a 429 says the server is alive, and an unparseable output is the model's. Nor
does an attempt a deadline cut short, which proves nothing about the endpoint, unless it was its call's first
(a call deadline shorter than the timeout leaves no full attempt to count). Any answer closes the breaker again.
Once it is open every later call fails at once with the same error and calls in flight stop waiting, so the run
ends with its finished results kept (each results line is fsynced) and the same command resumes it.

Who counts: this package's engines count each of their attempts (``lm.engine``). An LM whose engine is DSPy's
(a LiteLLM model string) retries inside DSPy, out of sight: its ``BreakerWatch`` callback counts the attempts of
each call that failed, and the debate's wait for a call (``Watch``, in ``lm.engine.within_deadline``) counts one
for every ``timeout`` seconds without an answer, since DSPy's own attempts end there.
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
from chateval_dspy.lm.call_limits import DEFAULT_BREAKER, check_threshold

_BREAKER_ATTR = "_chateval_breaker"
# What a DSPy-engine LM did when all the debate saw was silence: DSPy's attempts and retries are out of sight.
SILENCE = "no answer"


def failure_kind(exc: BaseException | None) -> str | None:
    """How the endpoint failed in ``exc`` (DSPy's wrapping looked through), or None when it is not the endpoint's fault.

    Example:
        >>> failure_kind(lm15.TimeoutError("slow")), failure_kind(lm15.ServerError("down", status=503))
        ('timed out', None)
        >>> failure_kind(lm15.TransportError("refused")), failure_kind(lm15.RateLimitError("busy", status=429))
        ('no connection', None)
    """
    if cause_of(exc, TimeoutError) is not None:  # lm15's timeouts and the sockets' alike
        return "timed out"
    if cause_of(exc, lm15.TransportError) is not None or cause_of(exc, ConnectionError) is not None:
        return "no connection"
    return None


class Breaker:
    """One endpoint's failed attempts in a row; at ``threshold`` it opens and every call fails with one ``FatalLMError``.

    Copies of its LM share it (optimizers copy LMs): one endpoint, one count.

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

    def __init__(self, endpoint: str, threshold: int = DEFAULT_BREAKER):
        self.endpoint, self.threshold = endpoint, check_threshold(threshold)
        self.failures = 0
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

    def failed(self, kind: str, attempts: int = 1) -> FatalLMError | None:
        """Count ``attempts`` failed attempts of ``kind``; the ``FatalLMError`` to raise once the breaker is open, else None."""
        with self._lock:
            self.failures += attempts
            self._kinds[kind] = None
            if self._message is None and self.failures >= self.threshold:
                self._message = (f"the endpoint {self.endpoint} failed {self.failures} attempts in a row "
                                 f"({', '.join(self._kinds)}): stopping the run; finished results are kept, rerun the "
                                 "same command to resume")
                for waiter in self._waiters:  # calls in flight stop waiting
                    waiter.set()
        return self.error()

    def trip(self, error: FatalLMError) -> FatalLMError:
        """Open the breaker at once with ``error`` (an answer that retrying cannot change, e.g. a gateway's spent
        budget): calls in flight stop waiting and later ones fail with it. Returns the error to raise (the first
        one's, when the breaker was already open).

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
            if self._message is None:
                self._message, self._kind = str(error), type(error)
                for waiter in self._waiters:
                    waiter.set()
        return self.error()

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
    if isinstance(found, Breaker):
        return found
    found = getattr(lm, _BREAKER_ATTR, None)
    return found if isinstance(found, Breaker) else None


def context_breakers() -> list[Breaker]:
    """The breakers of the LMs in the current DSPy context: the main LM's and a mixed panel's referees'."""
    found = (breaker_of(lm) for lm in (dspy.settings.lm, *referee_lms().values()))
    return list({id(b): b for b in found if b is not None}.values())


_ACTIVE: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("chateval_watch", default=None)


class Watch:
    """One LM call's wait: it ends when the call does or when a breaker opens (``lm.engine.within_deadline``).

    Args:
        breakers: The breakers of the caller's LMs; any of them opening ends the wait with its ``FatalLMError``.
        tick: Seconds without an answer that count as one failed attempt of the DSPy-engine LMs the call reached
            (their ``timeout``: DSPy's own attempt ends there); None: silence counts nothing.
    """

    def __init__(self, breakers: Iterable[Breaker], tick: float | None = None):
        self.breakers, self.tick = list(breakers), tick
        self.watched: list[Breaker] = []  # DSPy-engine LMs the call reached (their BreakerWatch adds them)
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
                for breaker in list(self.watched):
                    breaker.failed(SILENCE)
        if not self.done.is_set() and self.watched and self.ticks == 0:
            for breaker in list(self.watched):  # cut before one full attempt: the call's first attempt failed
                breaker.failed(SILENCE)
        stop = next(filter(None, (b.error() for b in [*self.breakers, *self.watched])), None)
        if stop is not None:
            raise stop from self.error
        return self.done.is_set()

    def _next(self, end: float) -> float:
        """When to look next: the end, or sooner the next tick."""
        return end if self.tick is None else min(end, self._started + (self.ticks + 1) * self.tick)


class BreakerWatch(BaseCallback):
    """Counts the attempts of an LM whose engine is DSPy's for its breaker (``with_breaker`` attaches it).

    A call that failed the endpoint's way failed ``1 + num_retries`` attempts (DSPy retries such failures),
    less those its ``Watch`` already counted for silence.
    """

    def __init__(self, breaker: Breaker):
        self.breaker = breaker
        self._calls: dict[str, tuple[Watch | None, int, int]] = {}

    def on_lm_start(self, call_id, instance, inputs) -> None:
        watch = _ACTIVE.get()
        if watch is not None:
            watch.use(self.breaker)
        self._calls[call_id] = (watch, watch.ticks if watch else 0, 1 + (getattr(instance, "num_retries", 0) or 0))

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
