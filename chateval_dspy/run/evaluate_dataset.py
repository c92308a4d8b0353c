"""``evaluate_dataset``: a dataset, a panel and an LM in, a resumable results file and its figures out.

``chateval evaluate`` as a Python function (the CLI adds the progress bar and the table). The results file is
found again by its run key, so the same call resumes it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.lm import tags
from chateval_dspy.lm.panel import referee_names
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.critical_path import critical_path
from chateval_dspy.run import identity, locks, records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.result import RunResult


@dataclass(frozen=True)
class RunPlan:
    """A dataset run resolved once, before any model starts (``plan_run``): its items, panel, LM, run key and
    results file. The CLI hands it to its tracker and to ``judge_plan``, so nothing is read or derived twice."""

    data: DataSpec
    config: DebateConfig
    lm: LMSpec
    items: list[dspy.Example]
    key: str
    out: Path

    @property
    def skipped(self) -> list[DataError]:
        """Malformed rows left out (``skip_bad_rows``)."""
        return list(getattr(self.items, "skipped", []))


@dataclass(frozen=True, kw_only=True)
class DatasetRun(RunPlan):
    """What ``judge_plan`` did: its plan's fields, the model that judged, the figures."""

    model: str
    result: RunResult
    referee_models: dict[str, str] = field(default_factory=dict)  # a mixed panel: role slug -> model name
    batch: dict | None = None  # batch mode: ``batch_summary`` of its waves

    def header(self) -> dict:
        return run_header(self.data, self.config, self.model, self.result.n, referee_models=self.referee_models)


# Items whose debates share the waves of batch mode: a wave carries every call they can make at once. Each item
# holds a thread per answer order (and per referee when they talk at once), so this bounds a run's threads.
BATCH_ITEMS = 256


def batch_items(concurrency: int, todo: int) -> int:
    """Items judged at once in batch mode: all that are left, at most ``BATCH_ITEMS`` (or ``concurrency`` if more).

    Example:
        >>> batch_items(1, 20), batch_items(1, 1000), batch_items(500, 1000)
        (20, 256, 500)
    """
    return max(1, concurrency, min(todo, BATCH_ITEMS))


def expected_waves(config: DebateConfig, todo: int, items_at_once: int) -> int:
    """Waves a batch run takes: its longest chain of dependent calls (``critical_path``), once per group of items
    judged at once (fewer when a finished item's next one joins the waves still going).

    Example:
        >>> expected_waves(DebateConfig(), 20, 20), expected_waves(DebateConfig(strategy="simultaneous_talk"), 20, 20)
        (4, 2)
    """
    groups = -(-todo // items_at_once) if todo else 0
    return critical_path(config)["chain"] * groups


def batch_summary(lm) -> dict:
    """What batch mode did: ``provider``, ``waves`` (run) and ``expected_waves``, ``batch_ids``, ``submitted``
    requests, and ``usd`` (the batches' cost as answered; None when unpriced)."""
    waves = lm.engine.waves
    return {"provider": waves.provider.name, "waves": waves.wave, "expected_waves": waves.expected,
            "batch_ids": list(dict.fromkeys(waves.batch_ids)), "submitted": waves.submitted, "usd": waves.usd}


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
            # Calibration swaps a pair's answer order: a pointwise run has none to swap.
            **({"calibrate": config.calibrate} if config.format == "pairwise" else {}), "aggregate": config.aggregate,
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


def journal_folder(path: Path) -> Path:
    """Where batch mode keeps a results file's batches and answers: ``<results file>.batches/``."""
    return path.with_name(path.name + ".batches")


def results_file(data: DataSpec, key: str, out: str | Path | None = None) -> Path:
    """``out`` or ``results/<dataset>-<run key>.jsonl``, its folder made.

    Example:
        >>> results_file(DataSpec("faireval"), "abc123", tmp / "runs" / "r.jsonl").parent.is_dir()
        True
    """
    path = Path(out) if out else Path("results") / f"{data.name}-{key}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def results_path(path: Path, key: str, *, overwrite: bool = False, ids=None) -> Path:
    """The results file ``path`` of run ``key``, its folder made and checked before any model starts (as its one
    writer, ``locks.exclusive``).

    A file of another run is refused (``ConfigError``), and so is a symbolic link as the file or as its batch
    journal (``journal_folder``): neither is written through. ``overwrite`` empties the file (and its journal)
    first. ``ids``: the run's item ids; lines of other items, and every line of an item after its first, are
    dropped (``records.ResultsStream``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    locks.refuse_link(path)
    locks.refuse_link(journal_folder(path), "batch journal")
    with locks.exclusive(path):
        if overwrite and path.exists():
            path.write_text("", encoding="utf-8")
        if overwrite and journal_folder(path).is_dir():
            shutil.rmtree(journal_folder(path))
        records.ResultsStream(path, key, ids=ids, check=records.check_result)
    return path


def plan_run(data: DataSpec, config: DebateConfig | Callable[[str], DebateConfig], lm: LMSpec,
             out: str | Path | None = None) -> RunPlan:
    """Read ``data``'s items, build the panel for their format (``config`` may be a function of it, as the CLI's
    flags are), check it judges their task and that ``lm``'s mixed panel names its referees, and fix the run key
    and results file (``results_file``): all before any model starts."""
    items, fmt = data.items()
    cfg = config(fmt) if callable(config) else config
    check_task(data, cfg)
    lm.check_panel(cfg.roles)
    key = identity.run_key(cfg, lm.identity(), items)
    return RunPlan(data, cfg, lm, items, key, results_file(data, key, out))


def evaluate_dataset(data: DataSpec, config: DebateConfig | Callable[[str], DebateConfig], lm: LMSpec, *,
                     out: str | Path | None = None, **how) -> DatasetRun:
    """Judge ``data``'s items with a panel built from ``config`` on ``lm``, resuming ``out`` if it holds part of this
    run: ``judge_plan(plan_run(data, config, lm, out), **how)``.

    ``config`` may be a function of the dataset's format (the CLI's flags). A second run on ``out`` while this one
    writes it is refused (``ConfigError`` naming this one's pid), and so is a symbolic link.

    Example:
        >>> run = evaluate_dataset(DataSpec("faireval", limit=2), DebateConfig(roles=("critic",), turns=1),
        ...                        LMSpec(model=fake_url, cache=False), out=tmp / "r.jsonl")  # an OpenAI-compatible URL
        >>> run.result.n, run.result.calls, run.model
        (2, 4, 'openai-compatible/fake-served')
    """
    return judge_plan(plan_run(data, config, lm, out), **how)


def judge_plan(plan: RunPlan, *, overwrite: bool = False, concurrency: int = 1,
               on_item: Callable[[dict], None] | None = None, on_wave: Callable[[dict], None] | None = None,
               on_start: Callable[[Path, str, dict[str, str]], None] | None = None) -> DatasetRun:
    """Judge a ``RunPlan``'s items into its results file, as its one writer from emptying or resuming the file to
    its last line.

    Args:
        on_wave: Batch mode (``lm.batch``): called with the waves' progress (``lm.batch.waves.Waves``).
        on_start: Called once the LM is up, before the first item, with the results file, the model's name and a
            mixed panel's referee models (a tracker logs them while the run goes on).
    """
    cfg, lm, path = plan.config, plan.lm, plan.out
    program = build_evaluator(cfg)  # its roles read and checked before any model starts
    with locks.exclusive(path):
        results_path(path, plan.key, overwrite=overwrite, ids=[x.id for x in plan.items])
        at_once, waves = _batching(plan, concurrency)
        # The requests carry the task and run as tags, for a shared gateway's spend logs (``lm.tags``).
        with tags.tagging(cfg.task_spec.name), \
                lm.judging(lm_slots(cfg, concurrency), journal=journal_folder(path), on_wave=on_wave) as judging_lm:
            if waves is not None:
                judging_lm.engine.waves.expected = waves
            if on_start is not None:
                on_start(path, judging_lm.model, referee_names())
            result = evaluate(program, plan.items, cfg, out=path, concurrency=at_once,
                              on_item=on_item, run_key=plan.key, waves=lm.batch)
            batch = batch_summary(judging_lm) if lm.batch else None
            return DatasetRun(**vars(plan), model=judging_lm.model, result=result, referee_models=referee_names(),
                              batch=batch)


def _batching(plan: RunPlan, concurrency: int) -> tuple[int, int | None]:
    """Items judged at once and the waves expected: a live run judges ``concurrency`` at once and plans no waves."""
    if not plan.lm.batch:
        return concurrency, None
    done = {str(r["id"]) for r in records.finished_records(plan.out, plan.key) if not records.is_error(r)}
    todo = sum(str(x.id) not in done for x in plan.items)
    at_once = batch_items(concurrency, todo)
    return at_once, expected_waves(plan.config, todo, at_once)
