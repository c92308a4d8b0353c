"""An evaluate run in MLflow: its config, model, data and split as params, figures with CIs, the results file.

The run is opened before the items are judged and ended by how the command ends (``optim.tracking.runs.run``)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

from chateval_dspy.data.splits import dataset_hash


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
    dataset and its hash, split, seed, limit, and how the labels were read (``data.<flag>``: ``DataSpec.reading``)."""
    return {"config": config_params(config), "model": model,
            **({"referee_models": dict(referee_models)} if referee_models else {}), "dataset": data.dataset,
            "dataset_hash": dataset_hash(items), "split": data.split, "seed": data.seed, "limit": data.limit,
            "data": data.reading(), **extra}


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


class EvaluationRun:
    """``chateval evaluate``'s MLflow run, opened before anything is judged (``evaluation_run``), RUNNING meanwhile:
    the model is logged once the LM is up (``judging``), figures, cost and files at the end (``log``)."""

    def __init__(self, active):
        self.run_id = active.info.run_id

    def judging(self, out: Path, model: str, referee_models: dict[str, str] | None = None) -> None:
        """The LM is up (``evaluate_dataset``'s ``on_start``): log the model, and a mixed panel's referee models."""
        from optim.tracking import runs as tracking

        tracking.log_params({"model": model, **({"referee_models": dict(referee_models)} if referee_models else {})})

    def log(self, done, metrics: dict) -> None:
        """The figures of a ``DatasetRun`` (from ``evaluate_dataset``) with their CIs, its cost, and its files.

        A task of one's own goes with it as ``task/task.json``; rows skipped as malformed as
        ``skipped/skipped_rows.json`` and the metric ``skipped_rows``. Cost in US dollars is logged as the metrics
        ``cost_usd_per_item`` and ``cost_usd_total`` when every model used is priced, else as the tag
        ``cost_usd: unpriced``; per-model figures as ``model/<name>/<figure>_per_item``.
        """
        from chateval_dspy.run.evaluate_dataset import skipped_rows
        from optim.tracking import runs as tracking

        cost, batch = done.result.cost(), getattr(done, "batch", None)
        tracking.set_tags({**unpriced_marks(cost), **batch_tags(batch)})
        extra = {"skipped_rows": len(done.skipped)} if done.skipped else {}
        waves = {"batch_waves": batch["waves"], "batch_submitted": batch["submitted"]} if batch else {}
        tracking.log_metrics(metrics, {**cost, **done.result.abstention_metrics(), **done.result.model_metrics(),
                                       **extra, **waves})
        tracking.log_file(done.out, "results")
        files = {"task": ("task.json", done.config.task and done.config.task.to_dict()),
                 "skipped": ("skipped_rows.json", done.skipped and skipped_rows(done.skipped))}
        with tempfile.TemporaryDirectory() as tmp:
            for artifact_dir, (name, content) in files.items():
                if content:
                    path = Path(tmp) / name
                    path.write_text(json.dumps(content, indent=2, ensure_ascii=False), encoding="utf-8")
                    tracking.log_file(path, artifact_dir)


@contextlib.contextmanager
def evaluation_run(data, config, items, *, out: str | Path, uri: str | None = None) -> Iterator[EvaluationRun]:
    """Open the evaluate run of results file ``out`` now, with ``run_params`` less the model (known once the LM is
    up: ``EvaluationRun.judging``) and the file as the tag ``chateval.out``.

    A SIGKILL leaves a run RUNNING (nothing can catch it): an earlier run of the same file whose process is gone
    (on this host) is ended KILLED first, when the same command is rerun to resume it.
    """
    from optim.tracking import runs as tracking

    scope = {"command": "evaluate", "chateval.out": str(Path(out).resolve())}
    tracking.end_dead_runs(scope, uri)
    params = run_params(data, config, "", items)
    params.pop("model")
    with tracking.run("evaluate", params=params, uri=uri, tags=scope) as active:
        yield EvaluationRun(active)


def log_evaluation(done, metrics: dict, *, uri: str | None = None) -> str:
    """Log a finished ``DatasetRun`` judged outside MLflow (the Python API) as one MLflow run; returns its id."""
    with evaluation_run(done.data, done.config, done.items, out=done.out, uri=uri) as tracked:
        tracked.judging(done.out, done.model, getattr(done, "referee_models", None))
        tracked.log(done, metrics)
    return tracked.run_id
