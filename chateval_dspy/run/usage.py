"""What one judged item cost, per model: LM calls, tokens, seconds and US dollars.

DSPy's usage tracker gives tokens per model name, only for calls that reached the LM; a DSPy callback
(``ModelMeter``) sees every call with its LM, so it counts calls and seconds and knows each model's price. An
unpriced model's ``cost_usd`` is None, and so is the item's (docs/cost.md).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict

from dspy.utils.callback import BaseCallback

from chateval_dspy.lm.pricing import Price, TokenCounts, add_usd, price_for, price_of, token_counts


class ModelMeter(BaseCallback):
    """Counts LM calls and their seconds per model name, and keeps each model's price.

    Enter it for one item with ``dspy.context(callbacks=[*dspy.settings.callbacks, meter])``; DSPy carries
    the callbacks into the threads a debate uses.

    Example:
        >>> import dspy
        >>> from chateval_dspy.testing.fake_lm import fake_lm
        >>> meter, lm = ModelMeter(), fake_lm()
        >>> with dspy.context(callbacks=[meter]):
        ...     _ = lm("hello")
        >>> meter.calls["fake/scripted"], meter.prices["fake/scripted"]
        (1, None)
    """

    def __init__(self):
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.prices: dict[str, Price | None] = {}
        self._started: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def on_lm_start(self, call_id, instance, inputs) -> None:
        model = str(getattr(instance, "model", "?"))
        with self._lock:
            self._started[call_id] = (model, time.perf_counter())
            self.calls[model] += 1
            if model not in self.prices or self.prices[model] is None:
                self.prices[model] = price_of(instance)

    def on_lm_end(self, call_id, outputs, exception=None) -> None:
        with self._lock:
            started = self._started.pop(call_id, None)
            if started is not None:
                self.seconds[started[0]] += time.perf_counter() - started[1]


def usage_by_model(tokens: dict[str, dict], entries: dict[str, list], meter: ModelMeter) -> dict[str, dict]:
    """Each model's figures over one item (``cached_calls``: answered by DSPy's cache; ``cached_prompt_tokens`` and
    ``cache_write_tokens``: parts of ``prompt_tokens`` read from and written to the provider's prompt cache).

    Args:
        tokens: ``UsageTracker.get_total_tokens()`` (summed usage per model).
        entries: ``UsageTracker.usage_data`` (one entry per call that reached the LM).

    Example:
        >>> m = ModelMeter()
        >>> m.calls["openai/gpt-4o-mini"] = 2
        >>> used = usage_by_model({"openai/gpt-4o-mini": {"prompt_tokens": 1000, "completion_tokens": 100,
        ...                        "prompt_tokens_details": {"cached_tokens": 600}}}, {"openai/gpt-4o-mini": [{}]}, m)
        >>> used["openai/gpt-4o-mini"]  # doctest: +NORMALIZE_WHITESPACE
        {'calls': 2, 'cached_calls': 1, 'prompt_tokens': 1000, 'cached_prompt_tokens': 600, 'cache_write_tokens': 0,
         'completion_tokens': 100, 'seconds': 0.0, 'cost_usd': 0.000165, 'cache_rates': 'read'}
    """
    out = {}
    for model in sorted(set(tokens) | set(meter.calls)):
        counts = token_counts(tokens.get(model))
        calls = meter.calls.get(model, len(entries.get(model) or ()))
        # A model the meter saw is priced as its LM says; one only the tracker saw, by its name.
        price = meter.prices[model] if model in meter.prices else price_for(model)
        out[model] = {"calls": calls, "cached_calls": max(0, calls - len(entries.get(model) or ())),
                      "prompt_tokens": counts.prompt_tokens, "cached_prompt_tokens": counts.cached_prompt_tokens,
                      "cache_write_tokens": counts.cache_write_tokens, "completion_tokens": counts.completion_tokens,
                      "seconds": round(meter.seconds.get(model, 0.0), 3),
                      "cost_usd": None if price is None else price.usd(
                          counts.prompt_tokens, counts.completion_tokens, cached_prompt_tokens=counts.cached_prompt_tokens,
                          cache_write_tokens=counts.cache_write_tokens),
                      "cache_rates": None if price is None else price.cache_rates}
    return out


def item_tokens(models: dict[str, dict]) -> TokenCounts:
    """The item's tokens over all its models (``usage_by_model``'s figures).

    Example:
        >>> item_tokens({"a": {"prompt_tokens": 10, "cached_prompt_tokens": 4, "completion_tokens": 2},
        ...              "b": {"prompt_tokens": 5, "cache_write_tokens": 5, "completion_tokens": 1}})
        TokenCounts(prompt_tokens=15, cached_prompt_tokens=4, cache_write_tokens=5, completion_tokens=3)
    """
    return TokenCounts(*(sum(used.get(name) or 0 for used in models.values()) for name in TokenCounts._fields))


def item_cost(models: dict[str, dict]) -> float | None:
    """The item's cost in US dollars: the sum over its models, None when any of them is unpriced.

    Example:
        >>> item_cost({"a": {"cost_usd": 0.5}, "b": {"cost_usd": 0.25}}), item_cost({"a": {"cost_usd": None}})
        (0.75, None)
    """
    return functools.reduce(add_usd, (used.get("cost_usd") for used in models.values()), 0.0)
