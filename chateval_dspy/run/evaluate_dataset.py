"""``evaluate_dataset``: a dataset, a panel and an LM in, a resumable results file and its figures out.

This is ``chateval evaluate`` as a Python function: the CLI adds only the progress bar and the
printed table. The results file is found again by its run key, so the same call resumes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
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

    def header(self) -> dict:
        return run_header(self.data, self.config, self.model, self.result.n)


def run_header(data: DataSpec, config: DebateConfig, model: str, n: int, split: str | None = None) -> dict:
    """What every printed or logged figure states: model, data, split, items, panel."""
    return {"model": model, "data": data.dataset, "split": f"{split or data.split} (seed {data.seed})", "items": n,
            "strategy": config.strategy, "roles": ",".join(config.roles), "turns": config.turns,
            "calibrate": config.calibrate, "aggregate": config.aggregate}


def lm_slots(config: DebateConfig, concurrency: int = 1) -> int:
    """Requests in flight: the items judged at once, times the referees who talk at once."""
    return concurrency * (len(config.roles) if config.strategy != "one_by_one" else 1)


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
        config: The panel, or a function of the dataset's format that returns it (the CLI's flags).
        lm: Which LM, and how it is called.
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
    program = build_evaluator(cfg)
    key = records.run_key(cfg, lm.identity(), items)
    path = results_path(data, key, out, overwrite=overwrite)
    with lm.judging(lm_slots(cfg, concurrency)) as judging_lm:
        result = evaluate(program, items, cfg, out=path, concurrency=concurrency, on_item=on_item, run_key=key)
        model = judging_lm.model
    return DatasetRun(data, cfg, items, path, key, model, result)
