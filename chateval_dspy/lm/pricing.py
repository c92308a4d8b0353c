"""What a run costs in US dollars: LiteLLM's own cost map, read offline, or a price the user states.

The cost map is the JSON file LiteLLM ships (``model_prices_and_context_window_backup.json``), the one it reads
itself under ``LITELLM_LOCAL_MODEL_COST_MAP=True``; it is read as a file, so pricing never imports LiteLLM (5-7 s).
A model the map does not price (the embedded model, a private base URL) is *unpriced*: its cost is ``None``, never
0, unless the caller states a price per million tokens (``--price-per-mtok in,out``).

The rules, in order: a price stated for an LM (``attach_price``; ``LMSpec.price_per_mtok`` states it for the run's
main model) wins; a model behind a base URL (``openai-compatible/<served id>``) or the embedded model is unpriced,
whatever its served id resembles, because a private endpoint's bill is not OpenAI's; any other model string is
looked up in the cost map by its name (``openai/gpt-4o-mini`` is priced as gpt-4o-mini wherever
``OPENAI_BASE_URL`` points).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

from chateval_dspy.errors import ConfigError

COST_MAP = "model_prices_and_context_window_backup.json"
UNPRICED = "unpriced"
# Names of models this program serves or reaches by URL: never looked up in the cost map.
PRIVATE_PREFIXES = ("embedded/", "openai-compatible/")
_PRICE_ATTR = "_chateval_price"


@dataclass(frozen=True)
class Price:
    """US dollars per million prompt (input) and completion (output) tokens, and where the figure came from.

    Example:
        >>> Price(0.15, 0.6, "litellm").usd(prompt_tokens=1000, completion_tokens=500)
        0.00045
    """

    input_per_mtok: float
    output_per_mtok: float
    source: str

    def usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return round((prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / 1e6, 10)


@functools.lru_cache(maxsize=1)
def _cost_map() -> dict:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(spec.submodule_search_locations[0]) / COST_MAP
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def litellm_price(model: str) -> Price | None:
    """The price LiteLLM's cost map gives ``model`` (``openai/gpt-4o-mini`` or ``gpt-4o-mini``), or None.

    Example:
        >>> litellm_price("openai/gpt-4o-mini").source
        'litellm'
        >>> litellm_price("embedded/gemma-3-270m-q4_k_m") is None
        True
    """
    table = _cost_map()
    for key in (model, model.split("/", 1)[-1]):
        entry = table.get(key)
        if isinstance(entry, dict) and entry.get("mode") in (None, "chat", "completion") \
                and isinstance(entry.get("input_cost_per_token"), (int, float)) \
                and isinstance(entry.get("output_cost_per_token"), (int, float)):
            return Price(entry["input_cost_per_token"] * 1e6, entry["output_cost_per_token"] * 1e6, "litellm")
    return None


def stated_price(text: str) -> Price:
    """``"0.15,0.6"`` (US dollars per million input and output tokens) as a Price; a ConfigError otherwise.

    Example:
        >>> stated_price("0.15,0.6")
        Price(input_per_mtok=0.15, output_per_mtok=0.6, source='stated')
    """
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        values = []
    if len(values) != 2 or not all(math.isfinite(v) and 0 <= v <= 10_000 for v in values):
        raise ConfigError(f"--price-per-mtok takes two prices in US dollars per million tokens, input,output "
                          f"(e.g. 0.15,0.6), each 0..10000; got {text!r}")
    return Price(values[0], values[1], "stated")


def price_for(model: str, stated: Price | None = None) -> Price | None:
    """The caller's stated price, else LiteLLM's, else None (unpriced); a private model is priced only when stated.

    Example:
        >>> price_for("openai-compatible/gpt-4o-mini") is None, price_for("openai/gpt-4o-mini").source
        (True, 'litellm')
        >>> price_for("embedded/gemma-3-270m-q4_k_m", stated_price("0,0")).source
        'stated'
    """
    if stated is not None:
        return stated
    if not isinstance(model, str) or model.startswith(PRIVATE_PREFIXES):
        return None
    return litellm_price(model)


def attach_price(lm, price: Price | None):
    """State ``price`` for ``lm`` (a ``dspy.LM``): its calls are then priced at it. Returns ``lm``.

    Example:
        >>> import dspy
        >>> lm = attach_price(dspy.LM("openai-compatible/llama"), stated_price("0.2,0.8"))
        >>> price_of(lm).input_per_mtok
        0.2
    """
    if price is not None:
        setattr(lm, _PRICE_ATTR, price)
    return lm


def price_of(lm) -> Price | None:
    """What ``lm``'s calls cost: the price stated for it, else the cost map's for its model name (``price_for``)."""
    stated = getattr(lm, _PRICE_ATTR, None)
    return price_for(getattr(lm, "model", None), stated if isinstance(stated, Price) else None)


def usd_text(value) -> str:
    """A dollar figure as the tables print it: ``$0.001234``, or ``unpriced`` (None or the word itself).

    Example:
        >>> usd_text(0.00045), usd_text(12.5), usd_text(None)
        ('$0.000450', '$12.500000', 'unpriced')
    """
    if value is None or value == UNPRICED:
        return UNPRICED
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "n/a"
    return f"${value:,.6f}"


def add_usd(a: float | None, b: float | None) -> float | None:
    """The sum of two costs, None (unpriced) when either is.

    Example:
        >>> add_usd(0.25, 0.5), add_usd(0.25, None)
        (0.75, None)
    """
    return None if a is None or b is None else round(a + b, 10)
