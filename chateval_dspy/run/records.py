"""Results files: JSON Lines, each line carrying the run key (``run.identity``) of its run, read back to resume it.

A line is written with one ``write``, flushed and fsynced, so a crash leaves at most one torn last line, which
``read_records`` cuts off. ``ResultsStream`` is the file ``evaluate()`` and ``score_file`` share; one writer per
file: ``run.locks``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from chateval_dspy.errors import ConfigError, DataError, shown
from chateval_dspy.files import fsync_dir
from chateval_dspy.run.locks import exclusive, refuse_link

log = logging.getLogger(__name__)


def append_record(sink: IO[str], record: dict) -> None:
    sink.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    sink.flush()
    os.fsync(sink.fileno())


def read_records(path: str | Path) -> list[dict]:
    """The complete records in ``path`` ([] if it does not exist); a torn last line is removed from the file."""
    return [record for _, record in numbered_records(path)]


def numbered_records(path: str | Path) -> list[tuple[int, dict]]:
    """``(line number, record)`` of every complete record in ``path`` (``read_records``), each checked by
    ``check_figures``."""
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
        except (ValueError, RecursionError) as exc:
            raise DataError(f"not a results line ({str(exc)[:200]}); move the file away or choose another --out",
                            source=str(path), row=i) from exc
        check_figures(record, path, i)
        records.append((i, record))
    return records


CACHE_COUNTS = ("cached_prompt_tokens", "cache_write_tokens")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _amount(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


_CALLS = (_whole, "a whole number of calls, 0 or more")
_TOKENS = (_whole, "a whole number of tokens, 0 or more")
# What a run adds up from a results line, and what each must be, at the line's top level or under a model of
# ``usage_by_model``; a field that is absent (a line written before it existed) counts as none.
FIGURES = {
    "calls": (lambda v: v is None or _whole(v), "a whole number of calls, 0 or more, or null"),
    "cached_calls": _CALLS, "failed_calls": _CALLS,
    "prompt_tokens": _TOKENS, "completion_tokens": _TOKENS, **{name: _TOKENS for name in CACHE_COUNTS},
    "seconds": (_amount, "a number of seconds, 0 or more"),
    "cost_usd": (lambda v: v is None or _amount(v), "a number of US dollars, 0 or more, or null"),
}
SHAPES = {
    "abstentions": (lambda v: v is None or isinstance(v, dict), "an object (referee turn: reason) or null"),
    "consistent": (lambda v: v is None or isinstance(v, bool), "true, false or null"),
    "empty": (lambda v: isinstance(v, list), "a list of field names"),
    "stage": (lambda v: v is None or isinstance(v, str), "a cascade's stage name or null"),
    "stages_run": (lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of stage names"),
    "usage_by_model": (lambda v: v is None or (isinstance(v, dict) and all(isinstance(f, dict) for f in v.values())),
                       "an object of an object of figures per model, or null"),
}
# What every line of an evaluate run holds (``RunResult.add`` reads them).
RESULT_FIELDS = ("human", "prediction", "abstained", "calls", "prompt_tokens", "completion_tokens", "seconds")


def check_figures(record: dict, path, row: int) -> None:
    """Refuse (``DataError`` naming file, line and field) a figure that a run would add up but could not: counts
    that are not whole numbers >= 0, seconds or dollars that are not numbers, objects that are not objects.

    Example:
        >>> check_figures({"id": 1, "cached_prompt_tokens": 5, "usage_by_model": {"m": {}}}, "r.jsonl", 3)
        >>> check_figures({"id": 1, "usage_by_model": {"m": {"cache_write_tokens": -1}}}, "r.jsonl", 3)
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.DataError: r.jsonl row 3: field 'usage_by_model.m.cache_write_tokens': ..., got -1; ...
        >>> check_figures({"id": 1, "calls": "lots"}, "r.jsonl", 4)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.DataError: r.jsonl row 4: field 'calls': must be a whole number of calls, ..., got 'lots'; ...
    """
    for name, (ok, what) in SHAPES.items():
        if name in record and not ok(record[name]):
            _refuse(path, row, name, what, record[name])
    used = record.get("usage_by_model") or {}
    for prefix, block in [("", record), *((f"usage_by_model.{_key(m)}.", figures) for m, figures in used.items())]:
        for name, (ok, what) in FIGURES.items():
            if name in block and not ok(block[name]):
                _refuse(path, row, f"{prefix}{name}", what, block[name])


def check_result(record: dict, path, row: int) -> None:
    """Refuse (``DataError`` naming file, line and field) a line of an evaluate run that lacks a field of
    ``RESULT_FIELDS`` (its figures are checked as it is read: ``check_figures``).

    Example:
        >>> check_result({"id": 1, "human": "1", "prediction": "2"}, "r.jsonl", 2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.DataError: r.jsonl row 2: field 'abstained': missing from a results line of a run; ...
    """
    missing = [name for name in RESULT_FIELDS if name not in record]
    if missing:
        raise DataError("missing from a results line of a run; move the file away or choose another --out",
                        source=str(path), row=row, field=missing[0])


def _key(name: str) -> str:
    """A model's name as a field path shows it: as it is when short and printable, else cut (``shown``)."""
    return name if len(name) <= 100 and name.isprintable() else shown(name, 60)


def _refuse(path, row: int, field: str, what: str, value) -> None:
    raise DataError(f"must be {what}, got {shown(value, 40)}; move the file away or choose another --out",
                    source=str(path), row=row, field=field)


def _check_key(out, records: list[dict], key: str | None) -> None:
    for record in records:
        if record.get("run_key") != key:
            raise ConfigError(f"{out} holds results of another run (run key {record.get('run_key')!r}, this run "
                              f"{key!r}): the config, model, items, program or its calibration (calibration.json) "
                              "differ. Choose another output file, or start it afresh (CLI: --overwrite)")


def finished_records(out: str | Path, key: str | None) -> list[dict]:
    """Records of run ``key`` already in ``out`` (for resuming); records of another run are an error."""
    records = read_records(out)
    _check_key(out, records, key)
    return records


def is_error(record: dict) -> bool:
    """An error line (a row that could not be judged): it never counts as a finished item."""
    return bool(record.get("error"))


class ResultsStream:
    """One resumable JSONL results file: what an earlier run finished, and a thread-safe ``append``.

    Creating it reads the file (a torn last line cut off; a figure that cannot be added up is a ``DataError`` naming
    line and field), refuses a line of another run (or one ``check`` refuses), and drops with an atomic rewrite:
    earlier error lines (an error costs no LM call, so each run writes one again for every row that still fails, and
    a fixed row leaves no stale error), every line of an item after its first, and (given ``ids``) lines of other
    items, the last two with a warning. So a finished run holds one line per item, however often it is rerun.
    ``path=None`` streams nowhere (``append`` only passes the record through). It is the file's one writer
    (``exclusive``) while it reads and rewrites, and from ``open`` to ``close``; a symbolic link is refused.

    Args:
        key: The run key stamped into each appended record (``run_key``) and required of every line read;
            None: lines are not checked and records are written as given.
        check: Called with each line but error lines, its file and line number, before anything is dropped
            (``check_result``: a line of an evaluate run).
    """

    def __init__(self, path: str | Path | None, key: str | None = None, *, id_field: str = "id",
                 ids: Iterable | None = None, check: Callable[[dict, Path, int], None] | None = None):
        self.path = Path(path) if path is not None else None
        self.key, self.id_field, self.check = key, id_field, check
        self.ids = None if ids is None else {str(i) for i in ids}
        self._lock = threading.Lock()
        self._sink: IO[str] | None = None
        self._held = contextlib.ExitStack()
        self.records: list[dict] = []  # finished records from earlier runs, in file order
        self.dropped_errors = self.dropped_repeats = self.dropped_strangers = 0
        self.done: set[str] = set()
        self._seen = None  # the file as read, to tell at open whether another writer changed it since
        if self.path is None:
            return
        refuse_link(self.path)
        if self.path.parent.is_dir():  # else there is no file to read, nor a folder for the lock file
            with exclusive(self.path):
                self._load()

    def _load(self) -> None:
        numbered = numbered_records(self.path)
        if self.key is not None:
            _check_key(self.path, [record for _, record in numbered], self.key)
        for row, record in numbered if self.check is not None else ():
            if not is_error(record):
                self.check(record, self.path, row)
        kept = self._counted(numbered)
        if len(kept) < len(numbered):
            self._rewrite({row for row, _ in kept})
        self.records = [record for _, record in kept]
        self.done = {str(r[self.id_field]) for r in self.records}
        self._seen = _identity(self.path)

    def _counted(self, numbered: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
        """The lines that count (the rest is dropped): no error line, an item's first line only, only ``ids``."""
        kept, first, repeats, strangers, errors = [], {}, [], [], 0
        for row, record in numbered:
            item = str(record.get(self.id_field))
            if is_error(record):
                errors += 1
            elif item in first:
                repeats.append((row, item))
            elif self.ids is not None and item not in self.ids:
                strangers.append((row, item))
            else:
                first[item] = row
                kept.append((row, record))
        if repeats:
            row, item = repeats[0]
            log.warning("%s: dropping %d line(s) that repeat an item already in it (row %d repeats id %s of row %d); "
                        "each item counts once", self.path, len(repeats), row, shown(item), first[item])
        if strangers:
            log.warning("%s: dropping %d line(s) of items that are not in this run's data (row %d: id %s)", self.path,
                        len(strangers), strangers[0][0], shown(strangers[0][1]))
        self.dropped_errors, self.dropped_repeats, self.dropped_strangers = errors, len(repeats), len(strangers)
        return kept

    def _rewrite(self, rows: set[int]) -> None:
        # The kept lines are copied byte for byte (not re-serialised), so a finished record never changes.
        lines = self.path.read_bytes().splitlines(keepends=True)
        kept = [line for i, line in enumerate(lines, start=1) if i in rows]
        # Temp file in the same folder + os.replace: a kill leaves either the old file or the new, never a mix.
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.writelines(kept)
                f.flush()
                os.fsync(f.fileno())
            shutil.copymode(self.path, tmp)  # mkstemp makes it owner-only; the user's file keeps its mode
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)

    def open(self) -> ResultsStream:
        if self.path is not None and self._sink is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            refuse_link(self.path)
            self._held.enter_context(exclusive(self.path))
            try:
                if _identity(self.path) != self._seen:
                    self._load()  # another run wrote it between reading and opening: what it holds now counts
                self._sink = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            except BaseException:
                self._held.close()
                raise
        return self

    def append(self, record: dict) -> dict:
        """Write ``record`` as one whole line, flushed and fsynced; returns it as written (with ``run_key``)."""
        if self.key is not None:
            record = {**record, "run_key": self.key}
        with self._lock:
            if self._sink is not None:
                append_record(self._sink, record)
            elif self.path is not None:
                raise ValueError("ResultsStream.append before open(): use it as a context manager")
            if not is_error(record):
                self.done.add(str(record[self.id_field]))
        return record

    def close(self) -> None:
        with self._lock:
            if self._sink is not None:
                self._sink.close()
                self._sink = None
        self._held.close()

    def __enter__(self) -> ResultsStream:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def _identity(path: Path) -> tuple | None:
    """What changes when a file is written or replaced (None: no file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
