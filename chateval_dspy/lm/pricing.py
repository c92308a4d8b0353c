"""What a run costs in US dollars: LiteLLM's own cost map (its shipped JSON, read as a file so pricing never imports
LiteLLM, 5-7 s), or a price the user states. A stated price (``attach_price``) wins; a model behind a base URL or the
embedded one is *unpriced* (``None``, never 0: a private endpoint's bill is not OpenAI's); any other model string is
looked up by name. Cache-read/write rates and how they show: docs/cost.md.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from chateval_dspy.errors import ConfigError

COST_MAP = "model_prices_and_context_window_backup.json"
UNPRICED = "unpriced"
# Names of models this program serves or reaches by URL: never looked up in the cost map. A batching LM
# (``batch/...``) carries the batch price it was given, or has none.
PRIVATE_PREFIXES = ("embedded/", "openai-compatible/", "batch/")
_PRICE_ATTR = "_chateval_price"


@dataclass(frozen=True, repr=False)
class Price:
    """US dollars per million tokens: input, output, and prompt-cache reads and writes (None: at the input rate).

    Example:
        >>> mini = Price(0.15, 0.6, "litellm", cached_prompt_per_mtok=0.075)  # 10,000 prompt tokens, 6,000 cached:
        >>> mini.usd(10_000, 500, cached_prompt_tokens=6_000), mini.cache_rates  # (4000*.15 + 6000*.075 + 500*.6)/1e6
        (0.00135, 'read')
        >>> stated = Price(1.0, 5.0, "stated")  # without cache rates, cached and written tokens cost as input
        >>> stated.usd(10_000, 0, cached_prompt_tokens=6_000, cache_write_tokens=2_000), stated.cache_rates
        (0.01, 'none')
    """

    input_per_mtok: float
    output_per_mtok: float
    source: str
    cached_prompt_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def usd(self, prompt_tokens: int, completion_tokens: int, *, cached_prompt_tokens: int = 0,
            cache_write_tokens: int = 0) -> float:
        """US dollars for a call's tokens; ``prompt_tokens`` includes ``cached_prompt_tokens`` and ``cache_write_tokens``."""
        uncached = prompt_tokens - cached_prompt_tokens - cache_write_tokens
        if uncached < 0 or cached_prompt_tokens < 0 or cache_write_tokens < 0:
            raise ValueError(f"prompt_tokens ({prompt_tokens}) must include cached_prompt_tokens "
                             f"({cached_prompt_tokens}) and cache_write_tokens ({cache_write_tokens})")
        read = self.input_per_mtok if self.cached_prompt_per_mtok is None else self.cached_prompt_per_mtok
        write = self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        return round((uncached * self.input_per_mtok + cached_prompt_tokens * read + cache_write_tokens * write
                      + completion_tokens * self.output_per_mtok) / 1e6, 10)

    @property
    def cache_rates(self) -> str:
        """Which cache rates the price has: ``read+write``, ``read``, ``write`` or ``none`` (the rest cost as input)."""
        return CACHE_RATES[(self.cached_prompt_per_mtok is not None, self.cache_write_per_mtok is not None)]

    @property
    def per_mtok(self) -> tuple[float, ...]:
        """The rates as ``--price-per-mtok`` states them (``stated_price(p.per_mtok)`` gives ``p`` back; a write rate
        without a read rate states the input rate as the read rate).

        Example:
            >>> stated_price("1,5").per_mtok, stated_price("1,5,0.1").per_mtok, stated_price("1,5,0.1,1.25").per_mtok
            ((1.0, 5.0), (1.0, 5.0, 0.1), (1.0, 5.0, 0.1, 1.25))
        """
        read = self.input_per_mtok if self.cached_prompt_per_mtok is None else self.cached_prompt_per_mtok
        rates = (self.input_per_mtok, self.output_per_mtok, read, self.cache_write_per_mtok)
        return rates[:4 if self.cache_write_per_mtok is not None else 3 if self.cached_prompt_per_mtok is not None else 2]

    def __repr__(self) -> str:
        # Cache rates only when there are some, so that a price of two rates reads as it always did.
        cache = "".join(f", {k}={getattr(self, k)!r}" for k in ("cached_prompt_per_mtok", "cache_write_per_mtok")
                        if getattr(self, k) is not None)
        return (f"Price(input_per_mtok={self.input_per_mtok!r}, output_per_mtok={self.output_per_mtok!r}, "
                f"source={self.source!r}{cache})")


# (has a read rate, has a write rate) -> the word ``Price.cache_rates`` and the results lines use.
CACHE_RATES = {(True, True): "read+write", (True, False): "read", (False, True): "write", (False, False): "none"}


def cache_rate_note(model: str, figures: dict) -> str | None:
    """What a table says under a model whose cached tokens were priced as input for want of a cache rate, else None
    (``figures``: a run's or item's ``cache_rates``, ``cached_prompt_tokens``, ``cache_write_tokens``).

    Example:
        >>> cache_rate_note("m", {"cache_rates": "none", "cached_prompt_tokens": 6000})
        "m: no cache rates in LiteLLM's cost map or --price-per-mtok: 6000 cached prompt tokens priced as input"
        >>> cache_rate_note("openai/gpt-4o-mini", {"cache_rates": "read", "cached_prompt_tokens": 6000}) is None
        True
    """
    rates = figures.get("cache_rates")
    if rates not in CACHE_RATES.values():
        return None
    priced_as_input = [f"{n} {what}" for n, what, kind in (
        (figures.get("cached_prompt_tokens") or 0, "cached prompt tokens", "read"),
        (figures.get("cache_write_tokens") or 0, "cache write tokens", "write")) if n and kind not in rates]
    if not priced_as_input:
        return None
    return (f"{model}: no cache rates in LiteLLM's cost map or --price-per-mtok: "
            f"{' and '.join(priced_as_input)} priced as input")


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
    return _map_price(model, "", "litellm")


def batch_price(model: str) -> Price | None:
    """The price LiteLLM's cost map gives ``model``'s batched requests (its ``..._batches`` rates; cached reads and
    cache writes without one are priced at the batch input rate), or None when the map states no batch price.

    Example:
        >>> batch_price("openai/gpt-4o-mini")
        Price(input_per_mtok=0.075, output_per_mtok=0.3, source='litellm-batch')
        >>> batch_price("anthropic/claude-haiku-4-5").cache_rates, batch_price("openai-compatible/m") is None
        ('read+write', True)
    """
    return _map_price(model, "_batches", "litellm-batch")


def _map_price(model: str, suffix: str, source: str) -> Price | None:
    # A chat model's input, output, cache-read and cache-write rates (each name + ``suffix``), under its full name
    # or without its provider prefix.
    table = _cost_map()
    for key in (model, model.split("/", 1)[-1]):
        entry = table.get(key)
        if isinstance(entry, dict) and entry.get("mode") in (None, "chat", "completion"):
            rates = [_per_mtok(entry.get(name + suffix)) for name in (
                "input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost",
                "cache_creation_input_token_cost")]
            if rates[0] is not None and rates[1] is not None:
                return Price(rates[0], rates[1], source, rates[2], rates[3])
    return None


def _per_mtok(per_token) -> float | None:
    # Rounded: 1e-07 * 1e6 is 0.09999999999999999 in floating point, and the tables print the rate.
    if not isinstance(per_token, (int, float)) or isinstance(per_token, bool) or not math.isfinite(per_token):
        return None
    return round(per_token * 1e6, 9)


def stated_price(text) -> Price:
    """``"in,out[,cached_read[,cache_write]]"`` (dollars per million tokens; a sequence of numbers will do too) as a
    Price; a ConfigError otherwise.

    Example:
        >>> stated_price("0.15,0.6")
        Price(input_per_mtok=0.15, output_per_mtok=0.6, source='stated')
        >>> stated_price("1,5,0.1,1.25").cache_rates, stated_price((1, 5, 0.1)).cache_rates
        ('read+write', 'read')
    """
    parts = text.split(",") if isinstance(text, str) else list(text) if isinstance(text, (tuple, list)) else [text]
    try:
        values = [float(v) for v in parts]
    except (TypeError, ValueError):
        values = []
    if len(values) not in (2, 3, 4) or not all(math.isfinite(v) and 0 <= v <= 10_000 for v in values):
        raise ConfigError(f"--price-per-mtok takes two prices in US dollars per million tokens, input,output "
                          f"(e.g. 0.15,0.6), optionally followed by the cache-read and cache-write prices "
                          f"(e.g. 1,5,0.1,1.25), each 0..10000; got {text!r}")
    return Price(values[0], values[1], "stated", *values[2:])


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


class TokenCounts(NamedTuple):
    """A call's (or a sum of calls') tokens; ``prompt_tokens`` includes the cache reads and the cache writes."""

    prompt_tokens: int
    cached_prompt_tokens: int
    cache_write_tokens: int
    completion_tokens: int


def token_counts(usage: dict | None) -> TokenCounts:
    """One usage dict (a call's, or DSPy's usage tracker's sum per model) as ``TokenCounts``.

    Cache reads/writes are in ``prompt_tokens_details`` and, from LiteLLM for Anthropic, again at the top level: the
    same tokens, read once, never summed. ``prompt_tokens`` already counts them unless it is smaller (Anthropic's
    disjoint counts via a custom engine): then they are added. A missing count is 0.

    Example:
        >>> token_counts({"prompt_tokens": 8100, "completion_tokens": 50, "cache_read_input_tokens": 6000,
        ...               "cache_creation_input_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 6000,
        ...               "cache_write_tokens": 2000, "cache_creation_tokens": 2000, "text_tokens": 100}})  # LiteLLM
        TokenCounts(prompt_tokens=8100, cached_prompt_tokens=6000, cache_write_tokens=2000, completion_tokens=50)
        >>> sum(token_counts({})), token_counts({"prompt_tokens": 100, "cache_read_input_tokens": 6000}).prompt_tokens
        (0, 6100)
    """
    usage = usage or {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    reads = _first_count(details.get("cached_tokens"), usage.get("cache_read_input_tokens"))
    writes = _first_count(details.get("cache_creation_tokens"), details.get("cache_write_tokens"),
                          usage.get("cache_creation_input_tokens"))
    prompt = _first_count(usage.get("prompt_tokens"))
    if prompt < reads + writes:
        prompt += reads + writes
    return TokenCounts(prompt, reads, writes, _first_count(usage.get("completion_tokens")))


def _first_count(*values) -> int:
    # The first count reported: one provider's two names for the same tokens are alternatives, not parts.
    return next((int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)), 0)
