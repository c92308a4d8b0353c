"""Score a user's file with a saved evaluator: resumable, and bad rows are reported, not fatal.

Every input row ends as exactly one line of the output: a verdict, or ``{"id", "row", "error"}``.
Rerunning after an interruption reads the output first and skips the ids already there, so no
finished item is judged (or paid for) twice. A half-written last line, left by a kill, is dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chateval_dspy.concurrency import bounded_unordered
from chateval_dspy.data.loaders import column_map, read_rows
from chateval_dspy.errors import DataError
from chateval_dspy.run.records import append_record, read_records

log = logging.getLogger(__name__)


@dataclass
class ScoreReport:
    total: int = 0
    skipped: int = 0  # already in the output from an earlier run
    scored: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (row, reason)


def finished_ids(out: Path) -> set[str]:
    """Ids already in ``out`` (a torn last line is cut off first, so appending stays valid JSONL)."""
    return {str(r["id"]) for r in read_records(out)}


def score_file(evaluator, src: str | Path, out: str | Path, *, columns: dict[str, str] | None = None,
               concurrency: int = 1, on_item: Callable[[dict], None] | None = None) -> ScoreReport:
    """Judge every row of ``src`` (JSONL/CSV) into ``out`` (JSONL), resuming where an earlier run stopped."""
    src, out = Path(src), Path(out)
    col = column_map(evaluator.format, columns)
    rows = read_rows(src)
    done = finished_ids(out)
    report = ScoreReport(total=len(rows))
    seen: set[str] = set()
    todo = []
    for row, record in rows:
        raw = record.get(col["id"])
        item_id = str(raw if raw not in (None, "") else row)
        if item_id in seen:
            report.rejected.append((row, f"duplicate id {item_id!r}"))
            todo.append((row, item_id, None))  # recorded as an error line, once
            continue
        seen.add(item_id)
        if item_id in done:
            report.skipped += 1
        else:
            todo.append((row, item_id, record))

    def judge(task):
        row, item_id, record = task
        if record is None:
            return {"id": f"{item_id}#row{row}", "row": row, "error": f"duplicate id {item_id!r}"}
        try:
            return evaluator({**record, col["id"]: item_id} if col["id"] != "id" else {**record, "id": item_id},
                             row=row, source=str(src)).to_dict() | {"row": row}
        except DataError as exc:
            return {"id": item_id, "row": row, "error": str(exc)}

    lock = threading.Lock()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as sink:
        for _, result in bounded_unordered(judge, todo, concurrency):
            with lock:
                append_record(sink, result)
                if result.get("error"):
                    if not result["error"].startswith("duplicate id"):
                        report.rejected.append((result["row"], result["error"]))
                else:
                    report.scored += 1
            if on_item:
                on_item(result)
    return report
