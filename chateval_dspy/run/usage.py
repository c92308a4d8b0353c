"""What one judged item cost, per model: LM calls, tokens, seconds and US dollars.

DSPy's usage tracker gives tokens per model name (only for calls that reached the LM; a cached answer
bills nothing). A DSPy callback (``ModelMeter``) sees every LM call with the LM that made it, so it counts
calls and seconds per model and knows each model's price (``lm.pricing.price_of``: a stated price, else
LiteLLM's cost map). A model without a price is *unpriced*: its ``cost_usd`` is None, and so is the item's.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from dspy.utils.callback import BaseCallback

from chateval_dspy.lm.pricing import Price, add_usd, price_for, price_of


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
    """``{model: {calls, cached_calls, prompt_tokens, completion_tokens, seconds, cost_usd}}`` of one item.

    Args:
        tokens: ``UsageTracker.get_total_tokens()`` (summed usage per model).
        entries: ``UsageTracker.usage_data`` (one entry per call that reached the LM).
        meter: The item's ``ModelMeter``.

    Example:
        >>> m = ModelMeter()
        >>> m.calls["openai/gpt-4o-mini"] = 2
        >>> usage_by_model({"openai/gpt-4o-mini": {"prompt_tokens": 1000, "completion_tokens": 100}},
        ...                {"openai/gpt-4o-mini": [{}]}, m)["openai/gpt-4o-mini"]
        {'calls': 2, 'cached_calls': 1, 'prompt_tokens': 1000, 'completion_tokens': 100, 'seconds': 0.0, 'cost_usd': 0.00021}
    """
    out = {}
    for model in sorted(set(tokens) | set(meter.calls)):
        used = tokens.get(model) or {}
        prompt, completion = used.get("prompt_tokens") or 0, used.get("completion_tokens") or 0
        calls = meter.calls.get(model, len(entries.get(model) or ()))
        # A model the meter saw is priced as its LM says; one only the tracker saw, by its name.
        price = meter.prices[model] if model in meter.prices else price_for(model)
        out[model] = {"calls": calls, "cached_calls": max(0, calls - len(entries.get(model) or ())),
                      "prompt_tokens": prompt, "completion_tokens": completion,
                      "seconds": round(meter.seconds.get(model, 0.0), 3),
                      "cost_usd": price.usd(prompt, completion) if price is not None else None}
    return out


def item_cost(models: dict[str, dict]) -> float | None:
    """The item's cost in US dollars: the sum over its models, None when any of them is unpriced.

    Example:
        >>> item_cost({"a": {"cost_usd": 0.5}, "b": {"cost_usd": 0.25}}), item_cost({"a": {"cost_usd": None}})
        (0.75, None)
    """
    total: float | None = 0.0
    for used in models.values():
        total = add_usd(total, used.get("cost_usd"))
    return total
