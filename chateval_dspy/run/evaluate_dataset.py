"""``evaluate_dataset``: a dataset, a panel and an LM in, a resumable results file and its figures out.

This is ``chateval evaluate`` as a Python function: the CLI adds only the progress bar and the
printed table. The results file is found again by its run key, so the same call resumes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.lm.panel import referee_names
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.critical_path import critical_path
from chateval_dspy.run import records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.result import RunResult


@dataclass
class DatasetRun:
    """What ``evaluate_dataset`` did: the items, where their results are, the LM that judged them, the figures."""

    data: DataSpec
    config: DebateConfig
    items: list[dspy.Example]
    out: Path
    key: str
    model: str
    result: RunResult
    skipped: list[DataError] = field(default_factory=list)  # malformed rows left out (``skip_bad_rows``)
    referee_models: dict[str, str] = field(default_factory=dict)  # a mixed panel: role slug -> model name

    def header(self) -> dict:
        return run_header(self.data, self.config, self.model, self.result.n, referee_models=self.referee_models)


def skipped_rows(skipped: list[DataError]) -> list[dict]:
    """The skipped rows as plain values (for a card, MLflow or JSON): row, field and reason.

    Example:
        >>> skipped_rows([DataError("field is missing", source="a.csv", row=3, field="question")])
        [{'row': 3, 'field': 'question', 'reason': 'field is missing'}]
    """
    return [{"row": e.row, "field": e.field, "reason": e.reason} for e in skipped]


def check_task(data: DataSpec, config: DebateConfig) -> None:
    """The panel must judge the task the items were read for (same inputs, criteria and scales)."""
    task = data.task_spec()
    if task is not None and task != config.task_spec:
        raise ConfigError(f"the data are items of task {task.name!r} but the panel judges task "
                          f"{config.task_spec.name!r}: give both the same task (DebateConfig(task=...), "
                          "DataSpec(task=...); CLI: --task)")


def run_header(data: DataSpec, config: DebateConfig, model: str, n: int, split: str | None = None, *,
               referee_models: dict[str, str] | None = None) -> dict:
    """What every printed or logged figure states: model (and a mixed panel's referee models), data, split,
    items, panel."""
    referees = {"referee_models": ",".join(f"{k}={v}" for k, v in referee_models.items())} if referee_models else {}
    path = critical_path(config)
    return {"model": model, **referees, "data": data.dataset,
            **({"task": config.task.name} if config.task is not None else {}),
            "split": f"{split or data.split} (seed {data.seed})", "items": n,
            "strategy": config.strategy, "roles": ",".join(config.roles), "turns": config.turns,
            "calibrate": config.calibrate, "aggregate": config.aggregate,
            # A verdict's latency floor: its longest chain of dependent LM calls, of all its calls.
            "critical_path": f"{path['chain']} of {path['calls']} calls" + (" (at most)" if path["upper_bound"] else "")}


def lm_slots(config: DebateConfig, concurrency: int = 1) -> int:
    """Requests in flight: the items judged at once, times the answer orders debated at once, times the referees
    who talk at once.

    Example:
        >>> lm_slots(DebateConfig()), lm_slots(DebateConfig(calibrate=False), 3)
        (2, 3)
    """
    orders = 2 if config.format == "pairwise" and config.calibrate else 1
    return concurrency * orders * (len(config.roles) if config.strategy != "one_by_one" else 1)


def results_path(data: DataSpec, key: str, out: str | Path | None = None, *, overwrite: bool = False) -> Path:
    """``out`` or ``results/<dataset>-<run key>.jsonl``, checked before any model starts.

    A file of another run is refused (``ConfigError``); ``overwrite`` empties it first.
    """
    path = Path(out) if out else Path("results") / f"{data.name}-{key}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if overwrite and path.exists():
        path.write_text("", encoding="utf-8")
    records.finished_records(path, key)
    return path


def evaluate_dataset(data: DataSpec, config: DebateConfig | Callable[[str], DebateConfig], lm: LMSpec, *,
                     out: str | Path | None = None, overwrite: bool = False, concurrency: int = 1,
                     on_item: Callable[[dict], None] | None = None) -> DatasetRun:
    """Judge ``data``'s items with a panel built from ``config`` on ``lm``, resuming ``out`` if it holds part of this run.

    Args:
        data: Which items (dataset, split, seed, limit).
        config: The panel, or a function of the dataset's format that returns it (the CLI's flags); it must
            judge the data's task (``DataSpec.task``).
        lm: Which LM, and how it is called; a mixed panel's ``referee_models`` must name referees of the panel.
        out: The results file (default ``results/<dataset>-<run key>.jsonl``).
        overwrite: Start ``out`` afresh instead of resuming it.
        concurrency: Items judged at once.
        on_item: Called with each record (a progress bar).

    Example:
        >>> run = evaluate_dataset(DataSpec("faireval", limit=2), DebateConfig(roles=("critic",), turns=1),
        ...                        LMSpec(model=fake_url, cache=False), out=tmp / "r.jsonl")  # an OpenAI-compatible URL
        >>> run.result.n, run.result.calls, run.model
        (2, 4, 'openai-compatible/fake-served')
    """
    items, fmt = data.items()
    cfg = config(fmt) if callable(config) else config
    check_task(data, cfg)
    lm.check_panel(cfg.roles)  # before any model starts
    program = build_evaluator(cfg)
    key = records.run_key(cfg, lm.identity(), items)
    path = results_path(data, key, out, overwrite=overwrite)
    with lm.judging(lm_slots(cfg, concurrency)) as judging_lm:
        result = evaluate(program, items, cfg, out=path, concurrency=concurrency, on_item=on_item, run_key=key)
        model, referees = judging_lm.model, referee_names()
    return DatasetRun(data, cfg, items, path, key, model, result, list(getattr(items, "skipped", [])), referees)
