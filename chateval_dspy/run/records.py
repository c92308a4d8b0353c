"""Results files and run identity: JSON Lines written one whole line at a time, read back to resume a run,
and the run key that says which run a file belongs to.

A line is written with one ``write`` then flushed and fsynced, so a crash leaves at most one
incomplete last line; ``read_records`` cuts such a line off before a run appends again.
``ResultsStream`` is the one resumable results file that ``evaluate()`` and ``score_file`` share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from chateval_dspy.errors import ConfigError, DataError, shown
from chateval_dspy.files import fsync_dir

log = logging.getLogger(__name__)


def append_record(sink: IO[str], record: dict) -> None:
    sink.write(_line(record))
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
        check_cache_counts(record, path, i)
        records.append(record)
    return records


CACHE_COUNTS = ("cached_prompt_tokens", "cache_write_tokens")


def check_cache_counts(record: dict, path, row: int) -> None:
    """Refuse (``DataError`` naming file and line) a cache count that is not a whole number >= 0, at the line's top
    level or under a model of ``usage_by_model``. Lines written before these counts existed have none: that is 0.

    Example:
        >>> check_cache_counts({"id": 1, "cached_prompt_tokens": 5, "usage_by_model": {"m": {}}}, "r.jsonl", 3)
        >>> check_cache_counts({"id": 1, "usage_by_model": {"m": {"cache_write_tokens": -1}}}, "r.jsonl", 3)
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.DataError: r.jsonl row 3: field 'usage_by_model.m.cache_write_tokens': ..., got -1; ...
    """
    used = record.get("usage_by_model")
    blocks = [("", record), *((f"usage_by_model.{model}.", figures) for model, figures in used.items()
                              if isinstance(figures, dict))] if isinstance(used, dict) else [("", record)]
    for prefix, block in blocks:
        for name in CACHE_COUNTS:
            value = block.get(name)
            if name in block and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise DataError(f"must be a whole number of tokens, 0 or more, got {shown(value, 40)}; move the file away "
                                "or choose another --out", source=str(path), row=row, field=f"{prefix}{name}")


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


def _check_key(out, records: list[dict], key: str | None) -> None:
    for record in records:
        if record.get("run_key") != key:
            raise ConfigError(f"{out} holds results of another run (run key {record.get('run_key')!r}, this run "
                              f"{key!r}): the config, model, items or program differ. Choose another output file, "
                              "or start it afresh (CLI: --overwrite)")


def finished_records(out: str | Path, key: str | None) -> list[dict]:
    """Records of run ``key`` already in ``out`` (for resuming); records of another run are an error."""
    records = read_records(out)
    _check_key(out, records, key)
    return records


# Sampling settings change the answers; transport settings (keys, URLs, timeouts, retries) do not, and a
# credential must not feed a hash that is written into every results line.
SAMPLING_KWARGS = ("temperature", "max_tokens", "max_completion_tokens", "top_p", "top_k", "n", "stop", "seed",
                   "frequency_penalty", "presence_penalty", "logit_bias", "reasoning_effort", "response_format")


def lm_identity(lm) -> dict:
    """The part of a ``dspy.LM`` that decides its answers: the model and its sampling settings.

    Example:
        >>> import dspy
        >>> lm_identity(dspy.LM("openai/m", temperature=0.5, max_tokens=64, api_key="sk-x"))
        {'model': 'openai/m', 'temperature': 0.5, 'max_tokens': 64}
    """
    if lm is None:
        return {"model": None}
    kwargs = getattr(lm, "kwargs", None) or {}
    return {"model": getattr(lm, "model", repr(lm)), **{k: kwargs[k] for k in SAMPLING_KWARGS if k in kwargs}}


def context_identity() -> dict:
    """The identity of the LMs in the current DSPy context: the main LM's (``lm_identity``), plus a mixed panel's
    referee LMs by role slug when any are bound (so a single-model run's key is what it always was).

    Example:
        >>> import dspy
        >>> from chateval_dspy.lm.panel import binding
        >>> with dspy.context(lm=dspy.LM("openai/a")), binding({"critic": dspy.LM("openai/b")}):
        ...     context_identity()["referees"]["critic"]["model"]
        'openai/b'
    """
    import dspy

    from chateval_dspy.lm.panel import referee_lms

    out = lm_identity(dspy.settings.lm)
    referees = referee_lms()
    if referees:
        out["referees"] = {slug: lm_identity(lm) for slug, lm in sorted(referees.items())}
    return out


def is_error(record: dict) -> bool:
    """An error line (a row that could not be judged): it never counts as a finished item."""
    return bool(record.get("error"))


class ResultsStream:
    """One resumable JSONL results file: what an earlier run finished, and a thread-safe ``append``.

    Creating it reads the file (a torn last line left by a kill is cut off), refuses it if ``key`` is given and
    any line belongs to another run, and drops earlier error lines (``{"id", "error", ...}``) with an atomic
    rewrite: an error costs no LM call, so each run writes one again for every row that still fails, and a
    row that was fixed meanwhile leaves no stale error behind. So a finished run leaves exactly one line per
    item, however often it is rerun. ``path=None`` streams nowhere (nothing to resume, ``append`` only passes
    the record through).

    Args:
        path: The results file (created, with its folder, on first ``open``), or None.
        key: The run key stamped into each appended record (``run_key``) and required of every line read;
            None: lines are not checked and records are written as given.
        id_field: The field that names an item.

    Example:
        >>> with ResultsStream("results.jsonl", key="abc123") as stream:  # doctest: +SKIP
        ...     for item in items:
        ...         if str(item.id) not in stream.done:
        ...             stream.append(judge(item))
    """

    def __init__(self, path: str | Path | None, key: str | None = None, *, id_field: str = "id"):
        self.path = Path(path) if path is not None else None
        self.key, self.id_field = key, id_field
        self._lock = threading.Lock()
        self._sink: IO[str] | None = None
        self.records: list[dict] = []  # finished records from earlier runs, in file order
        self.dropped_errors = 0
        if self.path is None:
            self.done: set[str] = set()
            return
        records = read_records(self.path)
        if key is not None:
            _check_key(self.path, records, key)
        self.records = [r for r in records if not is_error(r)]
        self.dropped_errors = len(records) - len(self.records)
        if self.dropped_errors:
            self._drop_error_lines()
        self.done = {str(r[id_field]) for r in self.records}

    def _drop_error_lines(self) -> None:
        # The kept lines are copied byte for byte (not re-serialised), so a finished record never changes.
        kept = [line for line in self.path.read_bytes().splitlines(keepends=True)
                if line.strip() and not is_error(json.loads(line))]
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
            self._sink = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
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

    def __enter__(self) -> ResultsStream:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def _line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, default=str) + "\n"
