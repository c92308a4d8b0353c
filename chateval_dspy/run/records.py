"""Results files: JSON Lines written one whole line at a time, and read back to resume a run.

A line is written with one ``write`` then flushed and fsynced, so a crash leaves at most one
incomplete last line; ``read_records`` cuts such a line off before a run appends again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import IO

from chateval_dspy.errors import DataError

log = logging.getLogger(__name__)


def append_record(sink: IO[str], record: dict) -> None:
    sink.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    sink.flush()
    os.fsync(sink.fileno())


def read_records(path: str | Path) -> list[dict]:
    """The complete records in ``path`` ([] if it does not exist); a torn last line is removed from the file."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        log.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted run", path, len(data) - keep)
        with open(path, "r+b") as f:
            f.truncate(keep)
        data = data[:keep]
    records = []
    for i, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "id" not in record:
                raise ValueError("no 'id'")
        except ValueError as exc:
            raise DataError(f"not a results line ({exc}); move the file away or choose another --out",
                            source=str(path), row=i) from exc
        records.append(record)
    return records
