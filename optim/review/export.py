"""The queue's answers for its owner, one row per reviewer and question: JSONL, or CSV for a spreadsheet.

A row: ``item_id``, ``trace_id``, ``question``, ``reviewer``, ``answer`` (the value, or "can't judge"),
``comment`` and ``answered_at`` (UTC, ISO 8601), in queue order. CSV cells that a spreadsheet would run as a formula
(a text starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) are written with a leading ``'``:
comments are typed by people and answers may come from anywhere.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

from optim.review.desk import Desk

COLUMNS = ("item_id", "trace_id", "question", "reviewer", "answer", "comment", "answered_at")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def answer_rows(desk: Desk) -> list[dict]:
    """Every answer of the queue's items (see the module docstring)."""
    rows = []
    for trace_id, (item_id, found) in desk.overview().items():
        for q in desk.questions:
            for who, a in sorted(found.get(q.name, {}).items()):
                when = datetime.fromtimestamp(a.time_ms / 1000, tz=timezone.utc).isoformat() if a.time_ms else ""
                rows.append({"item_id": item_id, "trace_id": trace_id, "question": q.name, "reviewer": who,
                             "answer": a.value, "comment": a.comment, "answered_at": when})
    return rows


def as_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def cell(value) -> object:
    """A CSV cell that a spreadsheet shows as text, never runs.

    Example:
        >>> cell("=HYPERLINK(1)"), cell(-3), cell("fine")
        ("'=HYPERLINK(1)", -3, 'fine')
    """
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA) else value


def as_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: cell(r[k]) for k in COLUMNS})
    return out.getvalue()
