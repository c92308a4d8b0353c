"""What LM work may take before a run gives up: the time bounds of an attempt, a call and a judged item
(``CallBounds``), how they follow an endpoint's measured speed (``Pace``), and the breaker's and
``rate_limit_wait``'s limits. Plain arithmetic, without DSPy or an HTTP client, so ``LMSpec`` and the parser state
these defaults without importing either (``lm.engine`` enforces them, ``lm.breaker`` counts failures).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from chateval_dspy.errors import ConfigError

DEFAULT_TIMEOUT = 120.0
DEFAULT_RETRIES = 2

# Four: at the default settings a dead endpoint stops the run within two 250 s call deadlines however the calls
# run (``dead_endpoint_stop``): 240.5 s with the panel's two answer orders at once, 490.5 s one call at a time.
DEFAULT_BREAKER = 4
MAX_BREAKER = 1000

# A slow but live endpoint's attempts get longer than the stated timeout, at most this many times: a laptop 8 times
# slower than idle (load 16 on 2 cores) still finishes, and a wedged server that still passes its liveness check
# still ends each attempt.
MAX_SLOWDOWN = 30.0
# An attempt may take this many times what the largest request so far would take at the measured pace.
PACE_MARGIN = 3.0
# Seconds an endpoint may answer 429 in a row (no answer between) before the run stops: a gateway's per-minute
# limits recover well within it, one that refuses for hours does not. Within the default call deadline (250 s), since
# a rate-limited call may not outlive its deadline either (it would become an abstention).
DEFAULT_RATE_LIMIT_WAIT = 240.0
# The longest single wait a 429's Retry-After gets (a longer one is waited in steps, asking again after each).
RATE_LIMIT_PAUSE_CAP_S = 60.0


@dataclass(frozen=True)
class CallBounds:
    """How long LM work may take: ``timeout`` seconds an attempt, ``retries`` after a transient failure,
    ``call_deadline`` a call (all attempts and backoff), ``item_deadline`` one judged item. Build it with ``derive``.

    Example:
        >>> CallBounds.derive(120)
        CallBounds(timeout=120.0, retries=2, call_deadline=250.0, item_deadline=1000.0)
        >>> CallBounds.derive(5, call_deadline=12).item_deadline
        48.0
    """

    timeout: float
    retries: int
    call_deadline: float
    item_deadline: float

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= 10:
            raise ConfigError(f"retries must be an integer in 0..10, got {self.retries!r}")
        for name in ("timeout", "call_deadline", "item_deadline"):
            object.__setattr__(self, name, _seconds(name, getattr(self, name)))

    @classmethod
    def derive(cls, timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES, call_deadline: float | None = None,
               item_deadline: float | None = None) -> CallBounds:
        """The bounds with any deadline left as None derived from ``timeout``: a call deadline of two full attempts
        plus 10 s for backoff and a quick third try (``2 * timeout + 10``), and an item deadline of four calls' worth
        (``4 * call_deadline``; the paper's panel makes 8 calls an item, so each may take nearly a full timeout)."""
        timeout = _seconds("timeout", timeout)
        call = 2 * timeout + 10 if call_deadline is None else call_deadline
        if item_deadline is None and isinstance(call, (int, float)) and not isinstance(call, bool):
            item_deadline = 4 * call
        return cls(timeout=timeout, retries=retries, call_deadline=call, item_deadline=item_deadline)


def _seconds(name: str, value, most: float = math.inf, words: str = "positive finite seconds") -> float:
    """``value`` as float seconds if it is a finite number in (0, ``most``], else a ``ConfigError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= most or value == math.inf:
        raise ConfigError(f"{name} must be {words}, got {value!r}")
    return float(value)


class Pace:
    """An endpoint's measured speed and the bounds that follow it: the stated bounds, stretched when it is slow.

    The pace is seconds per token of answered attempts (queueing included; slower taken at once, faster gradually).
    An attempt may take ``PACE_MARGIN`` times what the largest request so far needs at that pace (deadlines in
    proportion), up to ``MAX_SLOWDOWN`` times the stated bounds; a live endpoint's timeout doubles the stretch.

    Example:
        >>> pace = Pace(CallBounds.derive(10))
        >>> pace.answered(seconds=2.0, tokens_used=100, tokens_asked=400)  # 0.02 s a token: 400 tokens need 8 s
        >>> pace.bounds()  # 3 x 8 s = 24 s an attempt, 2.4 times the stated 10 s
        CallBounds(timeout=24.0, retries=2, call_deadline=72.0, item_deadline=288.0)
        >>> pace.timed_out(); pace.slowdown
        4.8
    """

    def __init__(self, stated: CallBounds):
        self.stated, self.slowdown = stated, 1.0
        self._per_token: float | None = None
        self._largest = 0
        self._lock = threading.Lock()

    def answered(self, seconds: float, tokens_used: int, tokens_asked: int) -> None:
        """An attempt answered after ``seconds``, having used ``tokens_used`` of the ``tokens_asked`` it could."""
        if not (seconds > 0 and tokens_used > 0):
            return
        per_token = seconds / tokens_used
        with self._lock:
            last = self._per_token
            self._per_token = per_token if last is None or per_token > last else 0.8 * last + 0.2 * per_token
            self._largest = max(self._largest, tokens_asked, tokens_used)
            need = PACE_MARGIN * self._per_token * self._largest
            self.slowdown = min(MAX_SLOWDOWN, max(1.0, need / self.stated.timeout))

    def timed_out(self) -> None:
        """A live endpoint let an attempt time out: stretch the bounds twice as far."""
        with self._lock:
            self.slowdown = min(MAX_SLOWDOWN, 2 * self.slowdown)

    def bounds(self) -> CallBounds:
        """The stated bounds, each times the current slowdown."""
        s, b = self.slowdown, self.stated
        if s == 1.0:
            return b
        return CallBounds(timeout=b.timeout * s, retries=b.retries, call_deadline=b.call_deadline * s,
                          item_deadline=b.item_deadline * s)


def check_rate_limit_wait(seconds) -> float:
    """``seconds`` if it is a positive finite wait of at most a day, else a ``ConfigError``.

    Example:
        >>> check_rate_limit_wait(30)
        30.0
        >>> check_rate_limit_wait(-1)
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: rate_limit_wait must be positive seconds, at most 86400, got -1
    """
    return _seconds("rate_limit_wait", seconds, 86400, "positive seconds, at most 86400")


def check_threshold(threshold) -> int:
    """``threshold`` if it is a whole number of attempts in 1..1000, else a ``ConfigError``.

    Example:
        >>> check_threshold(5)
        5
        >>> check_threshold(0)
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: breaker must be a whole number of failed attempts in 1..1000, got 0
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 1 <= threshold <= MAX_BREAKER:
        raise ConfigError(f"breaker must be a whole number of failed attempts in 1..{MAX_BREAKER}, got {threshold!r}")
    return threshold
