"""A results location for distributed scoring: a directory of JSON Lines part files, resumable by item id.

Every worker (a Ray actor, a Spark task) appends to a part file of its own (``part-<host>-<pid>-<random>.jsonl``),
one whole line per finished item, flushed and fsynced (``records.append_record``), so a kill leaves at most one
torn last line per part. Before a run the driver reads the directory (``prepare``): each part is read as
``score_file`` reads its output (``records.ResultsStream``: a torn last line is cut, error lines are dropped, an
item's repeated lines are dropped), and the ids with a verdict are done; workers skip them before any LM call.
Error lines never count as done: a rerun judges those rows again and writes one line for each.

Ids must be present and unique in the input: rows have no global order across partitions, so "the first of two
rows with one id" (``score_file``'s rule) is not defined; ``check_ids`` refuses such input before any LM call.

The location is a local path: on a cluster it must be a filesystem that every worker and the driver mount at the
same path (NFS, a mounted bucket). Object-store URLs (``s3://``, ``gs://``) are not supported: appending a line to an
object is not possible. One run writes a location at a time (``records.exclusive`` on ``<dir>/run.lock``: ``flock``,
which some network filesystems do not honour across hosts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from chateval_dspy.concurrency import bounded_unordered
from chateval_dspy.errors import ConfigError, DataError, shown
from chateval_dspy.run.records import ResultsStream, append_record, exclusive, is_error, refuse_link

log = logging.getLogger(__name__)
PART_GLOB = "part-*.jsonl"


@dataclass
class ScaleReport:
    """What a distributed scoring run did: rows in the input, skipped (done before), scored now, error lines now."""

    out: str
    total: int = 0
    skipped: int = 0
    scored: int = 0
    errors: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def results_dir(out: str | Path) -> Path:
    """``out`` as a local directory (created), refusing URLs and symbolic links with a ``ConfigError``."""
    text = str(out)
    if "://" in text:
        raise ConfigError(f"results location {shown(text, 80)}: only a local or mounted filesystem path is supported "
                          "(parts are appended line by line, which object stores cannot do)")
    path = Path(text).absolute()  # workers do not share the driver's working directory
    refuse_link(path, "results location")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"results location {path} is a file: give a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def part_files(out: str | Path) -> list[Path]:
    return sorted(Path(out).glob(PART_GLOB))


def prepare(out: Path) -> set[str]:
    """The ids with a verdict in ``out``; each part is cleaned as it is read (see the module docstring)."""
    done: set[str] = set()
    for part in part_files(out):
        stream = ResultsStream(part)
        repeats = done & stream.done
        if repeats:
            log.warning("%s repeats %d id(s) already in another part (first: %s): each counts once", part,
                        len(repeats), shown(sorted(repeats)[0]))
        done |= stream.done
    return done


@contextlib.contextmanager
def run_lock(out: Path):
    """Hold ``out`` for one run (``records.exclusive`` on ``<out>/run.lock``)."""
    with exclusive(out / "run"):
        yield


def check_ids(ids: Iterable, source: str) -> list[str]:
    """The ids as text; a ``DataError`` naming ``source`` when one is missing or repeated (module docstring)."""
    seen: set[str] = set()
    repeated: list[str] = []
    out = []
    for n, raw in enumerate(ids, start=1):
        if raw is None or raw == "" or (isinstance(raw, float) and raw != raw):
            raise DataError("an item has no id: distributed scoring resumes by id, so every row needs one",
                            source=source, row=n, field="id")
        item = str(raw)
        if item in seen:
            repeated.append(item)
        seen.add(item)
        out.append(item)
    if repeated:
        raise DataError(f"{len(repeated)} repeated id(s) (first: {shown(repeated[0])}): ids must be unique so that "
                        "verdicts can be matched to rows and a rerun can skip what is done", source=source, field="id")
    return out


def strangers_warning(done: set[str], ids: list[str], out: Path) -> int:
    """How many ``done`` ids the input has (skipped); done ids it lacks are only warned about (kept, not counted)."""
    have = set(ids)
    strangers = done - have
    if strangers:
        log.warning("%d verdict(s) in %s name ids that the input does not have (first: %s): not counted",
                    len(strangers), out, shown(sorted(strangers)[0]))
    return len(done & have)


class PartWriter:
    """One worker's part file in ``out``, created on the first append (no empty parts)."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self._sink: IO[str] | None = None

    def append(self, record: dict) -> None:
        if self._sink is None:
            name = f"part-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            self._sink = open(self.out / name, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        append_record(self._sink, record)

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def judge_rows(judge, records: list[dict], done: set[str], writer, *, concurrency: int, source: str) -> dict:
    """Judge the ``records`` whose id is not in ``done``, writing each line as it finishes; counts of what happened.

    A row the evaluator refuses (``DataError``) becomes an error line; any other failure (the LM is down) stops
    the batch, with every line finished so far already written.
    """
    todo = [r for r in records if str(r.get("id")) not in done]

    def one(record):
        try:
            return judge(record, source=source).to_dict()
        except DataError as exc:
            return {"id": str(record.get("id")), "error": str(exc)}

    counts = {"scored": 0, "errors": 0, "skipped": len(records) - len(todo)}
    for _, line in bounded_unordered(one, todo, max(1, concurrency)):
        writer.append(line)
        counts["errors" if is_error(line) else "scored"] += 1
    return counts


def clean_records(frame) -> list[dict]:
    """A pandas batch as item dicts: missing cells (NaN/None, as Arrow pads absent fields) left out."""
    rows = []
    for record in frame.to_dict("records"):
        rows.append({k: v for k, v in record.items() if not _missing(v)})
    return rows


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def read_results(out: str | Path):
    """One row per item id in ``out`` as a pandas DataFrame: its verdict, else its error line.

    Example:
        >>> w = PartWriter(tmp); w.append({"id": "a", "error": "bad"}); w.append({"id": "a", "winner": "1"}); w.close()
        >>> read_results(tmp)[["id", "winner"]].to_dict("records")
        [{'id': 'a', 'winner': '1'}]
    """
    import pandas as pd

    from chateval_dspy.run.records import read_records

    best: dict[str, dict] = {}
    for part in part_files(out):
        for record in read_records(part):
            item = str(record["id"])
            if item not in best or (is_error(best[item]) and not is_error(record)):
                best[item] = record
    return pd.DataFrame(list(best.values()))


def absolute(path: str | None) -> str | None:
    """``path`` made absolute on the driver (workers run in directories of their own), or None."""
    return str(Path(path).absolute()) if path else None


def worker_env(cache_dir: str | None) -> None:
    """Point this worker's LM cache at ``cache_dir`` (``CHATEVAL_CACHE_DIR``) before the evaluator loads."""
    if cache_dir:
        os.environ["CHATEVAL_CACHE_DIR"] = str(cache_dir)
