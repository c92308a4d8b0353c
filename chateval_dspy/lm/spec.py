"""``LMSpec``: which LM a run uses and how it is called, one frozen object beside ``DebateConfig``.

The CLI builds it from flags, Optuna and the benchmarks from their settings, ``load()`` from its
arguments; ``identity()`` is what changes the answers (and so what a run key holds).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import dspy

from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.engine import DEFAULT_RETRIES, DEFAULT_TIMEOUT, CallBounds


@dataclass(frozen=True)
class LMSpec:
    """The LM and its call settings.

    Args:
        model: ``embedded``, an OpenAI-compatible base URL, or a LiteLLM model string.
        served_model: The model id at a base URL (default: the first the server lists).
        temperature: Sampling temperature (0, as in the paper).
        max_tokens: Cap per call (default: 320 for the embedded model, 1024 otherwise).
        timeout: Seconds one attempt of one request may take.
        retries: Further attempts after a transient failure, in exactly one layer (see ``lm.engine``).
        call_deadline: Seconds one call may take, all attempts and backoff together (None: ``2 * timeout + 10``).
        item_deadline: Seconds all calls of one judged item may take (None: ``4 * call_deadline``).
        cache: DSPy's memory and disk cache of LM answers.
        cache_dir: The cache's directory (default ``$CHATEVAL_CACHE_DIR`` or ``~/.cache/chateval-dspy``).

    Example:
        >>> LMSpec(model="http://127.0.0.1:8000/v1", temperature=0.0).identity()["model"]
        'http://127.0.0.1:8000/v1'
        >>> LMSpec(temperature=3.0)
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: temperature must lie in 0..2, got 3.0
    """

    model: str = "embedded"
    served_model: str | None = None
    temperature: float = 0.0
    max_tokens: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    call_deadline: float | None = None
    item_deadline: float | None = None
    cache: bool = True
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("model must be 'embedded', an http(s) base URL or a LiteLLM model string")
        if not 0 <= self.temperature <= 2:
            raise ConfigError(f"temperature must lie in 0..2, got {self.temperature}")
        if self.max_tokens is not None and not 16 <= self.max_tokens <= 32768:
            raise ConfigError(f"max_tokens must lie in 16..32768, got {self.max_tokens}")
        if not 0 < self.timeout <= 3600:
            raise ConfigError(f"timeout must be positive seconds, at most 3600, got {self.timeout}")
        self.bounds()  # a bad retry count or deadline fails here, not when the LM starts

    def bounds(self) -> CallBounds:
        """The time bounds of one attempt, one call and one item, with the unset deadlines derived from ``timeout``.

        Example:
            >>> LMSpec(timeout=5).bounds()
            CallBounds(timeout=5.0, retries=2, call_deadline=20.0, item_deadline=80.0)
        """
        return CallBounds.derive(self.timeout, self.retries, self.call_deadline, self.item_deadline)

    def identity(self) -> dict:
        """What decides the answers: a results file resumes only under the same identity."""
        return {"model": self.model, "served_model": self.served_model, "temperature": self.temperature,
                "max_tokens": self.max_tokens}

    def to_dict(self) -> dict:
        return asdict(self)

    @contextlib.contextmanager
    def judging(self, slots: int = 1, *, threads: int | None = None) -> Iterator[dspy.LM]:
        """Start (embedded) or reach the LM, set the cache, and enter it with the JSON adapter.

        ``slots`` is how many requests the caller keeps in flight (the embedded server is laid out for them).
        """
        from chateval_dspy.lm import resolve  # looked up at call time, so tests can replace resolve_lm
        from chateval_dspy.lm.adapter import JudgeAdapter

        resolve.configure_cache(self.cache, self.cache_dir)
        with resolve.resolve_lm(self.model, slots=slots, temperature=self.temperature, max_tokens=self.max_tokens,
                                served_model=self.served_model, timeout=self.timeout, retries=self.retries,
                                call_deadline=self.call_deadline, item_deadline=self.item_deadline,
                                threads=threads) as lm, \
                dspy.context(lm=lm, adapter=JudgeAdapter()):
            yield lm
