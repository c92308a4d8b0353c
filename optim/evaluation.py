"""An evaluate run in MLflow: its config, model, data and split as params, figures with CIs, the results file."""

from __future__ import annotations

from chateval_dspy.data.loaders import dataset_hash


def run_params(data, config, model: str, items, **extra) -> dict:
    """The params every tracked run states: panel, model, dataset and its hash, split, seed, limit."""
    return {"config": config.to_dict(), "model": model, "dataset": data.dataset, "dataset_hash": dataset_hash(items),
            "split": data.split, "seed": data.seed, "limit": data.limit, **extra}


def log_evaluation(done, metrics: dict, *, uri: str | None = None) -> str:
    """Log a ``DatasetRun`` (from ``evaluate_dataset``) as one MLflow run; returns its id."""
    from optim import tracking

    with tracking.run("evaluate", params=run_params(done.data, done.config, done.model, done.items), uri=uri,
                      tags={"command": "evaluate"}) as active:
        tracking.log_metrics(metrics, {**done.result.cost(), **done.result.abstention_metrics()})
        tracking.log_file(done.out, "results")
    return active.info.run_id
