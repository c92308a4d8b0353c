"""What LM work may take before a run gives up on it: the time bounds of one attempt, one call and one judged item
(``CallBounds``, derived from the timeout), how they follow an endpoint's measured speed (``Pace``), the failed
attempts in a row after which an endpoint's breaker stops the run (``lm.breaker``), and how long an endpoint may
answer 429 in a row before the run stops (``rate_limit_wait``).

Plain data and arithmetic, without DSPy or an HTTP client, so that ``LMSpec`` and the ``chateval`` parser state
these defaults without importing either (``lm.engine`` enforces the bounds, ``lm.breaker`` counts the failures).
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


def default_call_deadline(timeout: float) -> float:
    """Two full attempts plus 10 s for backoff and a quick third try: ``2 * timeout + 10``."""
    return 2 * timeout + 10


def default_item_deadline(call_deadline: float) -> float:
    """Four calls' worth, ``4 * call_deadline`` (``8 * timeout + 40`` by default): the paper's panel makes
    8 calls an item, so every one of them may take nearly a full timeout before the item is cut short."""
    return 4 * call_deadline


@dataclass(frozen=True)
class CallBounds:
    """How long LM work may take. Build it with ``CallBounds.derive(timeout, ...)``.

    Args:
        timeout: Seconds one attempt may take.
        retries: Further attempts after a transient failure (timeout, lost connection, 429, 408/409, 5xx).
        call_deadline: Seconds one call may take, all attempts and backoff together.
        item_deadline: Seconds all calls of one judged item may take together.

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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(f"{name} must be positive finite seconds, got {value!r}")
            object.__setattr__(self, name, float(value))

    @classmethod
    def derive(cls, timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES, call_deadline: float | None = None,
               item_deadline: float | None = None) -> CallBounds:
        """The bounds with any deadline left as None derived from ``timeout`` (see the module's formulas)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ConfigError(f"timeout must be positive finite seconds, got {timeout!r}")
        call = default_call_deadline(timeout) if call_deadline is None else call_deadline
        if item_deadline is None and isinstance(call, (int, float)) and not isinstance(call, bool):
            item_deadline = default_item_deadline(call)
        return cls(timeout=timeout, retries=retries, call_deadline=call, item_deadline=item_deadline)


class Pace:
    """An endpoint's measured speed and the bounds that follow it: the stated bounds, stretched when it is slow.

    After each answered attempt the pace is its seconds per token (prompt and completion together; queueing at the
    server included, so a busy machine's slots count too). An attempt may take ``margin`` times what the largest
    request so far (its prompt plus ``max_tokens``) would take at that pace, when that is longer than the stated
    timeout; the call and item deadlines stretch in proportion, up to ``max_slowdown`` times. A slower pace is taken
    at once, a faster one gradually. An attempt that timed out against a live endpoint (``lm.breaker``) doubles the
    stretch: the machine got slower than measured.

    Example:
        >>> pace = Pace(CallBounds.derive(10))
        >>> pace.answered(seconds=2.0, tokens_used=100, tokens_asked=400)  # 0.02 s a token: 400 tokens need 8 s
        >>> pace.bounds()  # 3 x 8 s = 24 s an attempt, 2.4 times the stated 10 s
        CallBounds(timeout=24.0, retries=2, call_deadline=72.0, item_deadline=288.0)
        >>> pace.timed_out(); pace.slowdown
        4.8
    """

    def __init__(self, stated: CallBounds, margin: float = PACE_MARGIN, max_slowdown: float = MAX_SLOWDOWN):
        self.stated, self.margin, self.max_slowdown = stated, margin, max_slowdown
        self.slowdown = 1.0
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
            need = self.margin * self._per_token * self._largest
            self.slowdown = min(self.max_slowdown, max(1.0, need / self.stated.timeout))

    def timed_out(self) -> None:
        """A live endpoint let an attempt time out: stretch the bounds twice as far."""
        with self._lock:
            self.slowdown = min(self.max_slowdown, 2 * self.slowdown)

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
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 86400:
        raise ConfigError(f"rate_limit_wait must be positive seconds, at most 86400, got {seconds!r}")
    return float(seconds)


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
