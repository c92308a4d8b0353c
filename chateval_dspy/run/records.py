"""Results files and run identity: JSON Lines written one whole line at a time, read back to resume a run,
and the run key that says which run a file belongs to.

A line is written with one ``write`` then flushed and fsynced, so a crash leaves at most one
incomplete last line; ``read_records`` cuts such a line off before a run appends again.
``ResultsStream`` is the one resumable results file that ``evaluate()`` and ``score_file`` share.

One writer per results file: ``exclusive`` holds ``flock`` on ``<file>.lock`` (which names the holder's pid) for
as long as a run writes it, so a second run on the same file is refused instead of judging every item again, naming
the pid that the kernel says holds the lock. A lock file that is a link, a pipe or another file's second name is
refused, never written.
``flock`` is POSIX; where ``fcntl`` is missing (Windows) results files are not locked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from chateval_dspy.errors import ConfigError, DataError, shown
from chateval_dspy.files import fsync_dir

try:
    import fcntl
except ImportError:  # not POSIX: no lock (see the module docstring)
    fcntl = None

log = logging.getLogger(__name__)


def append_record(sink: IO[str], record: dict) -> None:
    sink.write(_line(record))
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


def run_key(config, lm: dict, items: Iterable, program_state: dict | None = None,
            calibration: dict | None = None) -> str:
    """What makes two runs the same run: the panel's config, the LM's identity, the exact items,
    (when given) the program's tuned state and its calibration. A results file resumes only under the same key.

    Args:
        config: The ``DebateConfig`` (only fields off their defaults count, so new fields keep old keys).
        lm: The LM's identity (``LMSpec.identity()``, or model and sampling of the LM in context).
        items: The items judged (ids, inputs and labels are hashed).
        program_state: A compiled program's ``dump_state()``; None for a program as built.
        calibration: The program's ``Calibration.to_dict()`` (its confidences and which verdicts it withholds);
            None without one, which keeps the key of an uncalibrated run what it always was.

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
    if calibration is not None:
        key["calibration"] = digest(calibration)
    return digest(key)


def digest(parts) -> str:
    """A short stable hash of JSON-able ``parts`` (the run key's, and the benchmarks' own keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


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


def refuse_link(path: str | Path, what: str = "results file") -> None:
    """A ``ConfigError`` if ``path`` is a symbolic link: a run writes (and ``--overwrite`` empties) its own files,
    never one that a link leads to.

    Example:
        >>> (tmp / "real.jsonl").touch(); (tmp / "link.jsonl").symlink_to(tmp / "real.jsonl")
        >>> refuse_link(tmp / "link.jsonl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: results file .../link.jsonl is a symbolic link; ...
    """
    if Path(path).is_symlink():
        raise ConfigError(f"{what} {path} is a symbolic link; refusing to write through it: give the file's own "
                          "path, or another one")


def lock_file(path: str | Path) -> Path:
    """The lock file of a results file: ``<file>.lock`` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


_held: dict[str, list] = {}  # lock file -> [fd, holding thread, depth]
_held_guard = threading.Lock()


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold the results file ``path`` for writing during the block: ``flock`` on ``lock_file(path)``, which holds
    this process's id while held and is removed on release. Re-entrant in the thread that holds it.

    Another process (or thread) holding it is a ``ConfigError`` naming its pid. A lock file left by a killed run
    holds no lock (the kernel releases a dead process's locks), so the next run takes it over.

    Example:
        >>> with exclusive(tmp / "r.jsonl"), exclusive(tmp / "r.jsonl"):
        ...     lock_file(tmp / "r.jsonl").read_text().strip() == str(os.getpid())
        True
        >>> lock_file(tmp / "r.jsonl").exists()
        False
    """
    if fcntl is None:
        yield
        return
    key = os.path.abspath(lock_file(path))
    with _held_guard:
        entry = _held.get(key)
        if entry is not None and entry[1] != threading.get_ident():
            raise ConfigError(f"{path} is being written by another thread of this process (pid {os.getpid()})")
        if entry is None:
            entry = _held[key] = [_lock(Path(key), path), threading.get_ident(), 0]
        entry[2] += 1
    try:
        yield
    finally:
        with _held_guard:
            entry[2] -= 1
            if entry[2] == 0:
                del _held[key]
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(key)  # while still locked: a run that opened this file meanwhile sees it went (_lock)
                os.close(entry[0])


def _lock(lock: Path, path) -> int:
    """A descriptor of ``lock`` locked by this process, with its pid written in; a ``ConfigError`` naming the
    holder when another process holds it, or when ``lock`` is not a file of its own (``_own_lock_file``)."""
    while True:
        try:
            # O_NONBLOCK: a named pipe put in the lock file's place must not block the open (it is refused next).
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot lock {path} for writing ({lock}: {exc.strerror or exc}): remove {lock} if it "
                              "is a link or not a regular file") from exc
        try:
            _own_lock_file(fd, lock, path)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = lock_holder(fd, lock)
            os.close(fd)
            raise ConfigError(f"{path} is being written by another run ({who}): wait for it to finish or stop it, or "
                              "choose another output file") from None
        except BaseException:
            os.close(fd)
            raise
        # The last holder removes the file as it lets go; a lock on a file that is gone keeps nobody out.
        try:
            here = os.stat(lock, follow_symlinks=False)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev) and mine.st_nlink == 1:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def _own_lock_file(fd: int, lock: Path, path) -> None:
    """A ``ConfigError`` unless ``fd`` is a regular file with no other name: the pid is written into a lock file, so a
    hard link to another file (which writing would overwrite) or a pipe or device is refused, not written."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"cannot lock {path} for writing: {lock} is not a regular file (a named pipe, a device or a "
                          "folder): remove it")
    if st.st_nlink > 1:
        raise ConfigError(f"cannot lock {path} for writing: {lock} has {st.st_nlink} names (a hard link to another "
                          "file, which locking would overwrite): remove it")


def lock_holder(fd: int, lock: Path) -> str:
    """Who holds the ``flock`` on ``fd``'s file, as the kernel says (``/proc/locks``, Linux): ``"pid N"``. Elsewhere,
    or where the kernel names no process this one can see, the pid the lock file claims, said to be unconfirmed
    (anyone who can write the file can write any number in it)."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            for line in table:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; waiters are listed as "1: -> FLOCK ...".
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit() \
                        and fields[4] != "0":
                    return f"pid {fields[4]}"
    except OSError:
        pass
    claim = os.pread(fd, 40, 0).decode("ascii", "replace").strip()
    said = f"its lock file {lock} says pid {claim}" if claim.isdigit() else f"lock file {lock}"
    return f"a process the system does not name; {said}, unconfirmed"


def is_error(record: dict) -> bool:
    """An error line (a row that could not be judged): it never counts as a finished item."""
    return bool(record.get("error"))


class ResultsStream:
    """One resumable JSONL results file: what an earlier run finished, and a thread-safe ``append``.

    Creating it reads the file (a torn last line left by a kill is cut off; a figure that cannot be added up is a
    ``DataError`` naming line and field), refuses it if ``key`` is given and any line belongs to another run (or
    ``check`` refuses a line), and drops with an atomic rewrite: earlier error lines (``{"id", "error",
    ...}``: an error costs no LM call, so each run writes one again for every row that still fails, and a row
    fixed meanwhile leaves no stale error behind), every line of an item after its first, and (given ``ids``)
    lines of items that are not the run's, the last two with a warning. So a finished run leaves exactly one
    line per item, however often it is rerun, and counts each once. ``path=None`` streams nowhere (nothing to
    resume, ``append`` only passes the record through).

    It is the file's one writer (``exclusive``) while it reads and rewrites, and from ``open`` to ``close``; a
    symbolic link as ``path`` is refused (``refuse_link``).

    Args:
        path: The results file (created, with its folder, on first ``open``), or None.
        key: The run key stamped into each appended record (``run_key``) and required of every line read;
            None: lines are not checked and records are written as given.
        id_field: The field that names an item.
        ids: The run's item ids, when the file holds no others; None: any.
        check: Called with each line but error lines, its file and line number, before anything is dropped
            (``check_result``: a line of an evaluate run).

    Example:
        >>> with ResultsStream("results.jsonl", key="abc123") as stream:  # doctest: +SKIP
        ...     for item in items:
        ...         if str(item.id) not in stream.done:
        ...             stream.append(judge(item))
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


def _line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, default=str) + "\n"
