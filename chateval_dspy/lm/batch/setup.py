"""Which Batch API a run's model goes through, checked before anything is submitted, and the batching LM itself.

``openai/<model>`` (``OPENAI_BASE_URL``/``OPENAI_API_KEY``), ``anthropic/<model>`` (``ANTHROPIC_*``), an
``http(s)://.../v1`` base URL (its ``/v1/batches``), or ``batch_dir`` (files for ``vllm run-batch``). A LiteLLM model
must be batch-priced in the cost map (or given ``--price-per-mtok``); a base URL or folder is unpriced unless stated.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dspy

from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.pricing import Price, attach_price, batch_price

PROVIDERS = {"openai/": "openai", "anthropic/": "anthropic"}
DEFAULT_POLL_SECONDS = 30.0
BATCH_PREFIX = "batch/"  # of a batching LM's name: the live LM's name follows it


@dataclass(frozen=True)
class BatchRoute:
    """Where a run's batches go: ``provider`` (``openai``, ``anthropic``, ``openai-compatible``, ``folder``), the
    model id its requests name, and the price per token of its batched requests (None: unpriced)."""

    provider: str
    model: str
    price: Price | None


def batch_route(model: str, *, served_model: str | None = None, batch_dir: str | None = None,
                stated: Price | None = None, referee_models=()) -> BatchRoute:
    """The route of ``model``'s batches, or a ``ConfigError`` saying why it has none (before any submission).

    Example:
        >>> route = batch_route("openai/gpt-4o-mini")
        >>> route.provider, route.model, route.price.per_mtok
        ('openai', 'gpt-4o-mini', (0.075, 0.3))
        >>> batch_route("embedded")
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: --batch: the embedded model has no batch API; run without --batch, ...
    """
    if referee_models:
        raise ConfigError("--batch: a mixed panel (--referee) is not batched; give every referee the run's model")
    if batch_dir is not None:
        name = served_model or (model.split("/", 1)[-1] if "/" in model and "://" not in model else None)
        if not name or model == "embedded":
            raise ConfigError("--batch-dir: name the model the engine serves with --served-model")
        return BatchRoute("folder", name, stated)
    if model == "embedded":
        raise ConfigError("--batch: the embedded model has no batch API; run without --batch, or write the waves "
                          "for a self-hosted engine with --batch-dir")
    if model.startswith(("http://", "https://")):
        return BatchRoute("openai-compatible", served_model or "", stated)
    prefix = next((p for p in PROVIDERS if model.startswith(p)), None)
    if prefix is None:
        raise ConfigError(f"--batch: no batch API for {model[:100]!r}: batch mode supports openai/<model>, "
                          "anthropic/<model>, an OpenAI-compatible base URL with /v1/batches, or --batch-dir")
    price = stated or batch_price(model)
    if price is None:
        raise ConfigError(f"--batch: {model[:100]!r} has no batch price in LiteLLM's cost map; state what its "
                          "batched requests cost with --price-per-mtok IN,OUT")
    return BatchRoute(PROVIDERS[prefix], model[len(prefix):], price)


def _provider(route: BatchRoute, model: str, batch_dir: str | None):
    if route.provider == "folder":
        from chateval_dspy.lm.batch.folder import FolderBatches

        return FolderBatches(Path(batch_dir), model=route.model)
    if route.provider == "anthropic":
        from chateval_dspy.lm.batch.anthropic import AnthropicBatches

        return AnthropicBatches()
    from chateval_dspy.lm.batch.openai_batches import OpenAIBatches
    from chateval_dspy.lm.resolve import base_url_key

    if route.provider == "openai-compatible":
        return OpenAIBatches(model, base_url_key())
    return OpenAIBatches(os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1",
                         os.environ.get("OPENAI_API_KEY") or "")


@contextlib.contextmanager
def batch_lm(route: BatchRoute, model: str, journal_folder: str | Path, *, batch_dir: str | None = None,
             temperature: float = 0.0, max_tokens: int | None = None, retries: int = 2,
             poll_seconds: float = DEFAULT_POLL_SECONDS,
             on_progress: Callable[[dict], None] | None = None) -> Iterator[dspy.LM]:
    """A ``dspy.LM`` whose calls go out in waves through ``route``'s Batch API, priced at ``route.price`` and named
    ``batch/`` + a live run's LM's name (``batch/openai/gpt-4o-mini``), so its figures read as batched."""
    from chateval_dspy.lm.batch.engine import BatchEngine
    from chateval_dspy.lm.batch.journal import Journal
    from chateval_dspy.lm.batch.waves import Waves

    provider = _provider(route, model, batch_dir)
    if route.provider == "openai-compatible" and not route.model:
        from chateval_dspy.lm.resolve import base_url_key, served_model_id

        route = BatchRoute(route.provider, served_model_id(model, base_url_key()), route.price)
    waves = Waves(provider, Journal(Path(journal_folder)), retries=retries, poll_seconds=poll_seconds,
                  price=route.price, on_progress=on_progress)
    engine = BatchEngine(waves, route.model)
    live = {"openai": "openai", "anthropic": "anthropic"}.get(route.provider, "openai-compatible")
    lm = dspy.LM(f"{BATCH_PREFIX}{live}/{route.model}", engine=engine, temperature=temperature,
                 max_tokens=max_tokens or 1024, num_retries=0)
    yield attach_price(lm, route.price)
