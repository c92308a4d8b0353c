"""An evaluate run in MLflow: its config, model, data and split as params, figures with CIs, the results file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from chateval_dspy.data.loaders import dataset_hash


def config_params(config) -> dict:
    """The config as MLflow params; a task of one's own as its compact form (``TaskSpec.params``: MLflow keeps
    at most 6,000 characters per param, and instructions may be longer). The whole spec is the ``task/``
    artifact and is in the saved evaluator's card."""
    out = config.to_dict()
    if config.task is not None:
        out["task"] = config.task.params()
    return out


def run_params(data, config, model: str, items, *, referee_models: dict | None = None, **extra) -> dict:
    """The params every tracked run states: panel, model (and a mixed panel's referee models, by role slug),
    dataset and its hash, split, seed, limit."""
    return {"config": config_params(config), "model": model,
            **({"referee_models": dict(referee_models)} if referee_models else {}), "dataset": data.dataset,
            "dataset_hash": dataset_hash(items), "split": data.split, "seed": data.seed, "limit": data.limit, **extra}


def unpriced_marks(cost: dict, prefix: str = "") -> dict[str, str]:
    """The dollar figures MLflow cannot hold as metrics (``unpriced``), as params/tags saying so.

    Example:
        >>> unpriced_marks({"cost_usd_per_item": "unpriced", "cost_usd_total": "unpriced", "calls_per_item": 8.0})
        {'cost_usd': 'unpriced'}
        >>> unpriced_marks({"cost_usd_per_item": 0.01, "cost_usd_total": 0.02})
        {}
    """
    from chateval_dspy.lm.pricing import UNPRICED

    return {f"{prefix}cost_usd": UNPRICED} if cost.get("cost_usd_total") == UNPRICED else {}


def batch_tags(batch: dict | None) -> dict:
    """A batch run's provider, waves and batch ids as MLflow tags ({} for a live run).

    Example:
        >>> batch_tags({"provider": "openai", "waves": 4, "expected_waves": 4, "batch_ids": ["b1", "b2"]})
        {'chateval.batch.provider': 'openai', 'chateval.batch.waves': '4 (expected 4)', 'chateval.batch.ids': 'b1,b2'}
    """
    if not batch:
        return {}
    # MLflow tags hold at most 8,000 characters; a very long run keeps its first ids (all are in the journal).
    return {"chateval.batch.provider": batch["provider"],
            "chateval.batch.waves": f"{batch['waves']} (expected {batch['expected_waves']})",
            "chateval.batch.ids": ",".join(batch["batch_ids"])[:7900]}


def log_evaluation(done, metrics: dict, *, uri: str | None = None) -> str:
    """Log a ``DatasetRun`` (from ``evaluate_dataset``) as one MLflow run; returns its id.

    A task of one's own goes with it as ``task/task.json``; rows skipped as malformed as
    ``skipped/skipped_rows.json`` and the metric ``skipped_rows``. Cost in US dollars is logged as the metrics
    ``cost_usd_per_item`` and ``cost_usd_total`` when every model used is priced, else as the tag
    ``cost_usd: unpriced``; per-model figures as ``model/<name>/<figure>_per_item``.
    """
    from chateval_dspy.run.evaluate_dataset import skipped_rows
    from optim import tracking

    extra = {"skipped_rows": len(done.skipped)} if done.skipped else {}
    cost = done.result.cost()
    params = run_params(done.data, done.config, done.model, done.items,
                        referee_models=getattr(done, "referee_models", None))
    batch = getattr(done, "batch", None)
    with tracking.run("evaluate", params=params, uri=uri,
                      tags={"command": "evaluate", **unpriced_marks(cost), **batch_tags(batch)}) as active:
        tracking.log_metrics(metrics, {**cost, **done.result.abstention_metrics(), **done.result.model_metrics(),
                                       **extra, **({"batch_waves": batch["waves"], "batch_submitted": batch["submitted"]}
                                                   if batch else {})})
        tracking.log_file(done.out, "results")
        with tempfile.TemporaryDirectory() as tmp:
            if done.config.task is not None:
                path = Path(tmp) / "task.json"
                path.write_text(json.dumps(done.config.task.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
                tracking.log_file(path, "task")
            if done.skipped:
                path = Path(tmp) / "skipped_rows.json"
                path.write_text(json.dumps(skipped_rows(done.skipped), indent=2, ensure_ascii=False), encoding="utf-8")
                tracking.log_file(path, "skipped")
    return active.info.run_id
