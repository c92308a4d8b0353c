"""``LMSpec``: which LM a run uses and how it is called, one frozen object beside ``DebateConfig``.

The CLI builds it from flags, Optuna and the benchmarks from their settings, ``load()`` from its
arguments; ``identity()`` is what changes the answers (and so what a run key holds).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.call_limits import (
    DEFAULT_BREAKER,
    DEFAULT_RATE_LIMIT_WAIT,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    CallBounds,
    check_rate_limit_wait,
    check_threshold,
)

if TYPE_CHECKING:
    import dspy

    from chateval_dspy.lm.pricing import Price


@dataclass(frozen=True)
class LMSpec:
    """The LM and its call settings.

    Args:
        model: ``embedded``, an OpenAI-compatible base URL, or a LiteLLM model string; None: a loaded evaluator's
            own model (its card's) for ``load()``, the embedded model everywhere else.
        timeout, retries, call_deadline, item_deadline: ``lm.call_limits.CallBounds``; retries happen in one layer.
        breaker, rate_limit_wait: when the run stops on a dead or rate-limiting endpoint (``lm.breaker``; the
            rate-limited items unrecorded for a rerun to judge). Not in batch mode.
        cache_dir: DSPy's cache directory (default ``$CHATEVAL_CACHE_DIR`` or ``~/.cache/chateval-dspy``).
        referee_models: A mixed panel: ``{role slug: model}`` (other settings shared), stored as sorted pairs.
        price_per_mtok: ``stated_price``'s rates for ``model`` (None: the cost map's); in batch mode, batched ones.
        batch: Judge through the provider's Batch API, in waves (``lm.batch``): half price, answers within hours.
        batch_dir: Batch mode for a self-hosted engine: waves as files in this folder for ``vllm run-batch``
            (implies ``batch``).

    Example:
        >>> LMSpec(model="http://127.0.0.1:8000/v1", temperature=0.0).identity()["model"]
        'http://127.0.0.1:8000/v1'
        >>> LMSpec(referee_models={"scientist": "openai/gpt-4o-mini"}).identity()["referee_models"]
        {'scientist': 'openai/gpt-4o-mini'}
        >>> LMSpec(price_per_mtok="0.2,0.8").price()
        Price(input_per_mtok=0.2, output_per_mtok=0.8, source='stated')
        >>> LMSpec(temperature=3.0)
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: temperature must lie in 0..2, got 3.0
    """

    model: str | None = None
    served_model: str | None = None
    temperature: float = 0.0
    max_tokens: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    call_deadline: float | None = None
    item_deadline: float | None = None
    breaker: int = DEFAULT_BREAKER
    rate_limit_wait: float = DEFAULT_RATE_LIMIT_WAIT
    cache: bool = True
    cache_dir: str | None = None
    referee_models: tuple[tuple[str, str], ...] | dict[str, str] = ()
    price_per_mtok: tuple[float, ...] | str | None = None
    batch: bool = False
    batch_dir: str | None = None
    batch_poll: float = 30.0

    def __post_init__(self) -> None:
        from chateval_dspy.lm.panel import check_referee_models
        from chateval_dspy.lm.pricing import stated_price

        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ConfigError("model must be 'embedded', an http(s) base URL or a LiteLLM model string")
        object.__setattr__(self, "referee_models", check_referee_models(self.referee_models))
        if self.price_per_mtok is not None:
            text = self.price_per_mtok if isinstance(self.price_per_mtok, str) else \
                ",".join(map(str, self.price_per_mtok)) if isinstance(self.price_per_mtok, (tuple, list)) else "?"
            object.__setattr__(self, "price_per_mtok", stated_price(text).per_mtok)
        if not 0 <= self.temperature <= 2:
            raise ConfigError(f"temperature must lie in 0..2, got {self.temperature}")
        if self.max_tokens is not None and not 16 <= self.max_tokens <= 32768:
            raise ConfigError(f"max_tokens must lie in 16..32768, got {self.max_tokens}")
        if not 0 < self.timeout <= 3600:
            raise ConfigError(f"timeout must be positive seconds, at most 3600, got {self.timeout}")
        self.bounds()  # a bad retry count or deadline fails here, not when the LM starts
        check_threshold(self.breaker)
        object.__setattr__(self, "rate_limit_wait", check_rate_limit_wait(self.rate_limit_wait))
        if self.batch_dir is not None:
            object.__setattr__(self, "batch", True)
        if not 0 < self.batch_poll <= 3600:
            raise ConfigError(f"batch_poll must be positive seconds, at most 3600, got {self.batch_poll}")
        if self.batch and self.model is not None:
            self.batch_route()  # a model without a batch API or a batch price fails before anything is submitted

    def batch_route(self):
        """Where this spec's batches go (``lm.batch.setup.BatchRoute``); a ConfigError when it has none.

        Example:
            >>> LMSpec(model="openai/gpt-4o-mini", batch=True).batch_route().provider
            'openai'
        """
        from chateval_dspy.lm.batch.setup import batch_route

        return batch_route(self.target, served_model=self.served_model, batch_dir=self.batch_dir,
                           stated=self.price(), referee_models=self.referee_models)

    def bounds(self) -> CallBounds:
        """The time bounds of one attempt, one call and one item, with the unset deadlines derived from ``timeout``.

        Example:
            >>> LMSpec(timeout=5).bounds()
            CallBounds(timeout=5.0, retries=2, call_deadline=20.0, item_deadline=80.0)
        """
        return CallBounds.derive(self.timeout, self.retries, self.call_deadline, self.item_deadline)

    @property
    def target(self) -> str:
        """The model these settings reach: ``model``, or the embedded model when none is named."""
        return self.model or "embedded"

    @property
    def referee_map(self) -> dict[str, str]:
        """``{role slug: model}`` of a mixed panel ({} when every referee runs on ``model``)."""
        return dict(self.referee_models)

    def price(self) -> Price | None:
        """The price stated for ``model`` (``price_per_mtok``), or None (then LiteLLM's cost map prices it, if it can)."""
        from chateval_dspy.lm.pricing import stated_price

        return stated_price(self.price_per_mtok) if self.price_per_mtok is not None else None

    def identity(self) -> dict:
        """What decides the answers (a results file resumes only under the same identity): not the price, and a
        mixed panel's referee models only when there are some, so a single-model spec's run keys stay as they were."""
        out = {"model": self.target, "served_model": self.served_model, "temperature": self.temperature,
               "max_tokens": self.max_tokens}
        if self.referee_models:
            out["referee_models"] = self.referee_map
        return out

    def check_panel(self, roles) -> None:
        """Every referee given a model sits on the panel ``roles`` (checked before any model starts)."""
        from chateval_dspy.lm.panel import check_panel

        check_panel(self.referee_map, roles)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["referee_models"] = self.referee_map
        return out

    @contextlib.contextmanager
    def judging(self, slots: int = 1, *, journal: str | Path | None = None,
                on_wave: Callable[[dict], None] | None = None) -> Iterator[dspy.LM]:
        """``opened``'s LMs, entered with the JSON adapter and a mixed panel's referee LMs bound (``lm.panel``);
        yields the main LM. Batch mode: ``journal`` keeps the batches beside the results file; ``on_wave`` sees
        their progress (``Waves``)."""
        import dspy

        from chateval_dspy.lm import tags
        from chateval_dspy.lm.adapter import DebateAdapter
        from chateval_dspy.lm.bound import binding

        with tags.tagging(), self.opened(slots, journal=journal, on_wave=on_wave) as (lm, referees), \
                dspy.context(lm=lm, adapter=DebateAdapter()), binding(referees):  # a caller's tags (its task) stay
            yield lm

    @contextlib.contextmanager
    def opened(self, slots: int = 1, *, journal: str | Path | None = None,
               on_wave: Callable[[dict], None] | None = None) -> Iterator[tuple[dspy.LM, dict[str, dspy.LM]]]:
        """``(main LM, {referee slug: LM})`` with this spec's settings, started or reached, stopped on exit (batch
        mode: the batching LM, no referee LMs). No DSPy context is entered (``judging`` does), so a loaded ``Judge``
        holds them and uses them from any thread."""
        from chateval_dspy.lm import panel, resolve
        from chateval_dspy.lm.batch.setup import batch_lm
        from chateval_dspy.lm.pricing import attach_price

        resolve.configure_cache(self.cache, self.cache_dir)
        if self.batch:
            if journal is None:
                raise ConfigError("batch mode keeps its batches beside a results file: give one (--out)")
            with batch_lm(self.batch_route(), self.target, journal, batch_dir=self.batch_dir,
                          temperature=self.temperature, max_tokens=self.max_tokens, retries=self.retries,
                          poll_seconds=self.batch_poll, on_progress=on_wave) as lm:
                yield lm, {}
            return
        settings = {name: getattr(self, name) for name in ("temperature", "max_tokens", "served_model", "timeout",
                    "retries", "call_deadline", "item_deadline", "breaker", "rate_limit_wait")}
        with panel.open_panel(self.target, self.referee_map, slots=slots, **settings) as (lm, referees):
            yield attach_price(lm, self.price()), referees
