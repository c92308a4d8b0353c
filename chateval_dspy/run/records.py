"""Results files and run identity: JSON Lines written one whole line at a time, read back to resume a run,
and the run key that says which run a file belongs to.

A line is written with one ``write`` then flushed and fsynced, so a crash leaves at most one
incomplete last line; ``read_records`` cuts such a line off before a run appends again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from chateval_dspy.errors import ConfigError, DataError

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


def run_key(config, lm: dict, items: Iterable, program_state: dict | None = None) -> str:
    """What makes two runs the same run: the panel's config, the LM's identity, the exact items and
    (when given) the program's tuned state. A results file resumes only under the same key.

    Args:
        config: The ``DebateConfig`` (only fields off their defaults count, so new fields keep old keys).
        lm: The LM's identity (``LMSpec.identity()``, or model and sampling of the LM in context).
        items: The items judged (ids, inputs and labels are hashed).
        program_state: A compiled program's ``dump_state()``; None for a program as built.

    Example:
        >>> from chateval_dspy.config import DebateConfig
        >>> a = run_key(DebateConfig(), {"model": "m"}, [])
        >>> a == run_key(DebateConfig(turns=3), {"model": "m"}, []), len(a)
        (False, 12)
    """
    from chateval_dspy.data.loaders import dataset_hash

    key = {"config": config.changes(), **lm, "items": dataset_hash(items)}
    if program_state is not None:
        key["program"] = digest(program_state)
    return digest(key)


def digest(parts) -> str:
    """A short stable hash of JSON-able ``parts`` (the run key's, and the benchmarks' own keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def finished_records(out: str | Path, key: str | None) -> list[dict]:
    """Records of run ``key`` already in ``out`` (for resuming); records of another run are an error."""
    records = read_records(out)
    for record in records:
        if record.get("run_key") != key:
            raise ConfigError(f"{out} holds results of another run (run key {record.get('run_key')!r}, this run "
                              f"{key!r}): the config, model, items or program differ. Choose another output file, "
                              "or start it afresh (CLI: --overwrite)")
    return records
