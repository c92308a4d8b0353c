"""What LM work may take before a run gives up on it: the time bounds of one attempt, one call and one judged item
(``CallBounds``, derived from the timeout), and the failed attempts in a row after which an endpoint's breaker stops
the run (``lm.breaker``).

Plain data and arithmetic, without DSPy or an HTTP client, so that ``LMSpec`` and the ``chateval`` parser state
these defaults without importing either (``lm.engine`` enforces the bounds, ``lm.breaker`` counts the failures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chateval_dspy.errors import ConfigError

DEFAULT_TIMEOUT = 120.0
DEFAULT_RETRIES = 2

# Four: at the default settings a dead endpoint stops the run within two 250 s call deadlines however the calls
# run (``dead_endpoint_stop``): 240.5 s with the panel's two answer orders at once, 490.5 s one call at a time.
DEFAULT_BREAKER = 4
MAX_BREAKER = 1000


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
