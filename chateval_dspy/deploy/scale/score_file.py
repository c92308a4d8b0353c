"""Score a user's file with a saved evaluator: resumable, and bad rows are reported, not fatal (docs/production.md).

Every input row ends as exactly one line of the output: a verdict, or ``{"id", "row", "error"}``; error lines never
count as done, so a rerun writes one again for each row that still fails. Every line carries the run key
(``parts.judge_run_key``), so a rerun by another evaluator, cascade or model is refused instead of mixing two runs'
verdicts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chateval_dspy.concurrency import bounded_unordered, run_gated
from chateval_dspy.data.loaders import column_map, item_from_record
from chateval_dspy.data.rows import read_rows
from chateval_dspy.deploy.scale.parts import judge_run_key
from chateval_dspy.errors import DataError, shown
from chateval_dspy.run.evaluate_dataset import batch_items, journal_folder
from chateval_dspy.run.locks import refuse_link
from chateval_dspy.run.records import ResultsStream, is_error

log = logging.getLogger(__name__)


@dataclass
class ScoreReport:
    total: int = 0
    skipped: int = 0  # already in the output from an earlier run
    scored: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (row, reason), in row order


def _todo(rows, id_column: str, done, src: Path, report: ScoreReport) -> list[tuple]:
    """``(row, item id, record or DataError)`` of every row still to judge; rows done before are counted skipped.
    Verdicts of ids that no row has are said in a warning: never counted, and kept (an earlier input's, perhaps)."""
    seen: set[str] = set()
    todo = []
    for row, record in rows:
        if isinstance(record, DataError):
            todo.append((row, f"#row{row}", record))
            continue
        raw = record.get(id_column)
        item_id = str(raw if raw not in (None, "") else row)
        if item_id in seen:
            todo.append((row, f"{item_id}#row{row}", DataError(
                f"duplicate id {item_id!r}: ids must be unique so verdicts can be matched to rows",
                source=str(src), row=row, field=id_column)))
            continue
        seen.add(item_id)
        if item_id in done:
            report.skipped += 1
        else:
            todo.append((row, item_id, record))
    strangers = sorted(set(done) - seen)
    if strangers:
        log.warning("%d verdict(s) in the output name ids that no row of %s has (first: %s): not counted", len(strangers),
                    src, shown(strangers[0]))
    return todo


def score_file(evaluator, src: str | Path, out: str | Path, *, columns: dict[str, str] | None = None,
               concurrency: int = 1, on_item: Callable[[dict], None] | None = None, waves: bool = False) -> ScoreReport:
    """Judge every row of ``src`` (JSONL/CSV) into ``out`` (JSONL), resuming where an earlier run stopped.

    Args:
        evaluator: A loaded ``Judge`` (anything with ``format`` or ``task``, and ``__call__(item, row=, source=)``).
        out: One run writes it at a time (``locks.exclusive``); a symbolic link (or one as its batch journal) is
            refused.
        columns: Our field name -> the user's column name, for any field (``id`` and the inputs alike).
        on_item: Called with each line written (verdicts and errors).
        waves: Batch mode (the evaluator loaded with ``batch``): the rows judged at once make their LM calls in
            waves (``concurrency.run_gated``); a cascade's, stage by stage (``CascadeJudge.in_stages``).
    """
    src, out = Path(src), Path(out)
    if waves:
        refuse_link(journal_folder(out), "batch journal")
    fmt = getattr(evaluator, "task", evaluator.format)  # a loaded Judge knows its task; else the format's built-in
    col = column_map(fmt, columns)
    rows = read_rows(src, bad_rows="keep")
    report = ScoreReport(total=len(rows))
    # The run key (evaluator, calibration, models) refuses a rerun by anything else, its calibration included.
    key = judge_run_key(evaluator) if hasattr(evaluator, "program") or hasattr(evaluator, "stages") else None
    with ResultsStream(out, key) as stream:
        todo = _todo(rows, col["id"], stream.done, src, report)

        def item(task):
            """The item's own fields, checked against the user's columns (so an error names their column)."""
            row, item_id, record = task
            if isinstance(record, DataError):
                raise record
            item_from_record(record, fmt, columns=col, source=str(src), row=row)
            return {**{name: record[theirs] for name, theirs in col.items() if theirs in record}, "id": item_id}

        def judge(task):
            try:
                return evaluator(item(task), row=task[0], source=str(src)).to_dict() | {"row": task[0]}
            except DataError as exc:
                return {"id": task[1], "row": task[0], "error": str(exc)}

        workers = batch_items(concurrency, len(todo)) if waves else max(1, concurrency)
        if waves and callable(getattr(evaluator, "in_stages", None)):
            results = _in_stages(evaluator, todo, item, src, workers)
        else:
            results = (result for _, result in (run_gated if waves else bounded_unordered)(judge, todo, workers))
        for result in results:
            stream.append(result)
            if is_error(result):
                report.rejected.append((result["row"], result["error"]))
            else:
                report.scored += 1
            if on_item:
                on_item(result)
    report.rejected.sort()
    return report


def _in_stages(cascade, todo: list[tuple], item, src: Path, workers: int):
    """A cascade's lines in batch mode: rows that cannot be read first (no LM call), then each item as it leaves
    the cascade, stage by stage (``CascadeJudge.in_stages``)."""
    examples = []
    for task in todo:
        row, item_id, _ = task
        try:
            examples.append((task, cascade.stages[0].example(item(task), row=row, source=str(src))))
        except DataError as exc:
            yield {"id": item_id, "row": row, "error": str(exc)}
    for (row, _, _), verdict in cascade.in_stages(examples, run_gated, workers):
        yield verdict.to_dict() | {"row": row}
