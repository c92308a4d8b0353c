"""A results location for distributed scoring: a directory of JSON Lines part files, resumable by item id (the rules a
user meets, damage included: docs/many-machines.md, "Ray and Spark scoring that resumes").

Every worker (a Ray actor, a Spark task) appends to a part file of its own, created new (never through a link), one
whole fsynced line per finished item (``records.append_record``), so a kill leaves at most one torn last line.
Before a run the driver reads the directory (``begin``, under ``run_lock``: ``locks.exclusive`` on
``<dir>/run.lock``, a ``flock`` that some network filesystems do not honour across hosts); each worker checks its own
identity (``run_key``; a cascade's covers its thresholds and every stage) before its first LM call (``stamp``; the
driver does when every id is done: ``check_finished``). Ids must be present and unique (``check_ids``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from chateval_dspy.concurrency import bounded_unordered, call_slots
from chateval_dspy.errors import ConfigError, DataError, shown
from chateval_dspy.run.identity import digest
from chateval_dspy.run.locks import exclusive, refuse_link
from chateval_dspy.run.records import append_record, check_figures, is_error

log = logging.getLogger(__name__)
PART_GLOB = "part-*.jsonl"


@dataclass
class ScaleReport:
    """What a distributed scoring run did: rows in the input, skipped (done before), scored now, error lines now,
    and lines of the directory skipped as damaged (``torn``: their items are judged again)."""

    out: str
    total: int = 0
    skipped: int = 0
    scored: int = 0
    errors: int = 0
    torn: int = 0

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


@dataclass(frozen=True)
class RunIdentity:
    """What the driver found for this run: its evaluator's digest, and the run key of the lines already in the
    directory (None: none yet). Each worker checks its own against it before any LM call (``stamp``)."""

    evaluator: str
    run_key: str | None = None


def evaluator_digest(program) -> str:
    """A digest of a loaded evaluator: its panel config, tuned state (instructions, demos) and calibration, not its
    LMs."""
    state = {name: {k: v for k, v in entry.items() if k != "lm"} if isinstance(entry, dict) else entry
             for name, entry in program.dump_state().items()}
    identity = {"config": program.config.to_dict(), "state": state}
    calibration = getattr(program, "calibration", None)
    if calibration is not None:  # it decides which verdicts are withheld; none keeps an older digest unchanged
        identity["calibration"] = calibration.to_dict()
    return digest(identity)


def saved_digest(evaluator: str) -> str:
    """``evaluator_digest`` (a cascade's ``cascade_digest``) of the saved evaluator at ``evaluator``, read on the
    driver without binding any LM."""
    import tempfile

    from chateval_dspy.deploy.saved.cascade import cascade_digest, is_cascade, read_cascade, without_threshold
    from chateval_dspy.deploy.saved.fetch import MLFLOW_SCHEMES, from_mlflow
    from chateval_dspy.deploy.saved.store import load_program

    with tempfile.TemporaryDirectory(prefix="chateval-digest-") as tmp:
        found = (from_mlflow(evaluator, Path(tmp), False) if str(evaluator).startswith(MLFLOW_SCHEMES)
                 else Path(evaluator))
        if not is_cascade(found):
            return evaluator_digest(load_program(found)[0])
        spec, digests = read_cascade(found), []
        for stage in spec.stages:
            program = load_program(stage.dir)[0]
            without_threshold(program)  # as the cascade runs it
            digests.append(evaluator_digest(program))
        return cascade_digest(spec, digests)


def judge_digest(judge) -> str:
    """``evaluator_digest`` of a loaded judge's program, or a ``CascadeJudge``'s ``cascade_digest``."""
    from chateval_dspy.deploy.saved.cascade import cascade_digest

    if getattr(judge, "stages", None) is None:
        return evaluator_digest(judge.program)
    return cascade_digest(judge.spec, [evaluator_digest(j.program) for j in judge.stages])


def judge_run_key(judge) -> str:
    """The run key of a loaded judge's results: its ``judge_digest`` and the identity of every LM it bound (each
    stage's, for a cascade), so that another evaluator, cascade or model never resumes them."""
    from chateval_dspy.run.identity import lm_identity

    def lms(j) -> dict:
        return {"lm": lm_identity(j.lm),
                "referees": {slug: lm_identity(r) for slug, r in sorted(getattr(j, "referee_lms", {}).items())}}

    stages = getattr(judge, "stages", None)
    return digest({"evaluator": judge_digest(judge), **(lms(judge) if stages is None else {"stages": list(map(lms, stages))})})


def stamp(judge, identity: RunIdentity, out) -> dict:
    """The identity fields a worker writes into each line; a ``ConfigError`` (before any LM call) when the evaluator
    it loaded is not the driver's, or when ``out`` holds another run's lines (another model or sampling)."""
    judges = getattr(judge, "stages", None) or [judge]
    mine = judge_digest(judge)
    if mine != identity.evaluator:
        raise ConfigError(f"this worker loaded an evaluator (digest {mine}) other than the one the driver read (digest "
                          f"{identity.evaluator}): every worker and the driver must read the same saved evaluator (a "
                          "shared path, or a fixed MLflow model version)")
    key = judge_run_key(judge)
    if identity.run_key is not None and key != identity.run_key:
        models = "+".join(str(j.lm.model) for j in judges)
        raise ConfigError(f"{out} holds verdicts of another run (run key {identity.run_key}; this run's is {key}, the "
                          f"same evaluator on {shown(models, 60)} with these settings): choose another results "
                          "directory, or rerun with the model and settings that wrote it")
    return {"evaluator": mine, "run_key": key}


def check_finished(where: Path, evaluator: str, model: str | None, identity: RunIdentity, cache: bool) -> None:
    """When every id is done no worker starts, so the driver binds the LM itself and compares run keys (``stamp``):
    a rerun on another model must not report another run's verdicts as its own."""
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.lm.spec import LMSpec

    if identity.run_key is not None:
        with load(evaluator, lm=LMSpec(model=model, cache=cache), slots=1) as judge:
            stamp(judge, identity, where)


@dataclass
class PartsRead:
    """Every part of a results directory, checked (``read_parts``): the first verdict of each id, the first error
    line of each id, the directory's identity, and how many lines were skipped as damaged."""

    verdicts: dict[str, dict] = field(default_factory=dict)
    errors: dict[str, dict] = field(default_factory=dict)
    evaluator: str | None = None
    run_key: str | None = None
    torn: int = 0
    first: str = "this run"  # where the identity the lines are held to was set


def read_parts(out: str | Path, evaluator: str | None = None, *, cut: bool = False) -> PartsRead:
    """Read and check every part of ``out`` (docs/many-machines.md's rules): lines held to ``evaluator`` (None: to the
    first line's), one run key throughout, damaged lines skipped and counted. ``cut``: a torn last line is removed
    from its file (only under ``run_lock``: a running worker may be writing it)."""
    got = PartsRead(evaluator=evaluator)
    repeats: list[tuple[str, Path]] = []
    seen_in: dict[str, Path] = {}
    for part in part_files(out):
        lines, torn = _part_lines(part, cut)
        got.torn += torn
        for row, record in lines:
            _check_identity(got, record, f"{part} line {row}")
            item = str(record["id"])
            if is_error(record):
                got.errors.setdefault(item, record)
            elif item in got.verdicts:
                repeats.append((item, part))
            else:
                got.verdicts[item], seen_in[item] = record, part
    if repeats:
        item, part = repeats[0]
        log.warning("%d verdict(s) repeat an id judged in another part (a retried task; first: id %s in %s, counted "
                    "from %s): the part whose name sorts first counts", len(repeats), shown(item), part, seen_in[item])
    return got


def _check_identity(got: PartsRead, record: dict, where: str) -> None:
    evaluator, key = record.get("evaluator"), record.get("run_key")
    if not isinstance(evaluator, str) or not isinstance(key, str):
        raise ConfigError(f"{where} carries no run identity (evaluator and run_key): it was not written by a scoring "
                          "run of this chateval-dspy, so it cannot count. Move that part out of the directory, or "
                          "choose another results directory")
    if got.evaluator is None:
        got.evaluator, got.first = evaluator, where
    if evaluator != got.evaluator:
        raise ConfigError(f"{where} was written by another evaluator (digest {shown(evaluator, 40)}; {got.first}: "
                          f"{got.evaluator}): a results directory holds one run. Choose another results directory, "
                          "or move the other run's parts away")
    if got.run_key is None:
        got.run_key, got.first = key, where
    elif key != got.run_key:
        raise ConfigError(f"{where} belongs to another run (run key {shown(key, 40)}; {got.first}: {got.run_key}): the "
                          "same evaluator on another model or settings. Choose another results directory, or move "
                          "the other run's parts away")


def _part_lines(part: Path, cut: bool) -> tuple[list[tuple[int, dict]], int]:
    """``(line number, record)`` of each results line of ``part``, and how many other lines were skipped."""
    refuse_link(part, "part file")
    data = part.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        if cut:
            log.warning("%s: dropping an incomplete last line (%d bytes) left by a stopped worker", part,
                        len(data) - keep)
            fd = os.open(part, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.ftruncate(fd, keep)
            finally:
                os.close(fd)
        data = data[:keep]
    lines, bad = [], []
    for row, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("id"), (str, int)) or isinstance(record["id"], bool):
                raise ValueError("not an object with an 'id'")
            check_figures(record, part, row)
        except (ValueError, RecursionError, DataError):
            bad.append(row)
            continue
        lines.append((row, record))
    if bad:
        log.warning("%s: skipping %d line(s) that are not results lines (first: line %d; a torn write or damage): "
                    "their items are judged again, and every other line of the file counts", part, len(bad), bad[0])
    return lines, len(bad)


def begin(where: Path, evaluator: str, ids: list[str]) -> tuple[RunIdentity, frozenset, ScaleReport]:
    """Read ``where`` for a run of ``evaluator`` over ``ids`` (under ``run_lock``): the identity workers must match,
    the ids done, and the report so far. A line of another run is a ``ConfigError`` (``read_parts``)."""
    got = read_parts(where, saved_digest(evaluator), cut=True)
    done, have = set(got.verdicts), set(ids)
    if done - have:  # kept (an earlier input's, perhaps), never counted
        log.warning("%d verdict(s) in %s name ids that the input does not have (first: %s): not counted",
                    len(done - have), where, shown(sorted(done - have)[0]))
    report = ScaleReport(out=str(where), total=len(ids), skipped=len(done & have), torn=got.torn)
    return RunIdentity(got.evaluator, got.run_key), frozenset(done & have), report


def run_lock(out: Path):
    """Hold ``out`` for one run (``locks.exclusive`` on ``<out>/run.lock``)."""
    return exclusive(out / "run")


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


class PartWriter:
    """One worker's part file in ``out``, created on the first append (no empty parts); every line carries
    ``identity`` (``stamp``: the evaluator's digest and the run key)."""

    def __init__(self, out: str | Path, identity: dict):
        self.out, self.identity = Path(out), identity
        self._sink: IO[str] | None = None

    def append(self, record: dict) -> None:
        if self._sink is None:
            name = f"part-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            # A new file of its own: never one that exists, nor one that a link leads to.
            fd = os.open(self.out / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            self._sink = os.fdopen(fd, "a", encoding="utf-8")
        append_record(self._sink, {**record, **self.identity})

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def judge_rows(judge, records: list[dict], done: set[str], writer, *, concurrency: int, source: str,
               max_in_flight: int | None = None) -> dict:
    """Judge the ``records`` whose id is not in ``done`` (``concurrency`` at once, at most ``max_in_flight`` LM calls
    at once), writing each line as it finishes; counts of what happened. A row the evaluator refuses is an error
    line; any other failure (the LM is down) stops the batch, every line finished so far written."""
    todo = [r for r in records if str(r.get("id")) not in done]

    def one(record):
        try:
            return judge(record, source=source).to_dict()
        except DataError as exc:
            return {"id": str(record.get("id")), "error": str(exc)}

    counts = {"scored": 0, "errors": 0, "skipped": len(records) - len(todo)}
    with call_slots(max_in_flight):
        for _, line in bounded_unordered(one, todo, max(1, concurrency)):
            writer.append(line)
            counts["errors" if is_error(line) else "scored"] += 1
    return counts


def clean_records(frame) -> list[dict]:
    """A pandas batch as item dicts: missing cells (NaN/None, as Arrow pads absent fields) left out."""
    return [{k: v for k, v in record.items() if v is not None and not (isinstance(v, float) and v != v)}
            for record in frame.to_dict("records")]


def read_results(out: str | Path):
    """One row per item id in ``out`` as a pandas DataFrame: its verdict, else its error line (``read_parts``'s
    rules: a line of another run is a ``ConfigError``; damaged lines are skipped and warned about).

    Example:
        >>> w = PartWriter(tmp, {"evaluator": "e", "run_key": "k"})
        >>> w.append({"id": "a", "error": "bad"}); w.append({"id": "a", "winner": "1"}); w.close()
        >>> read_results(tmp)[["id", "winner"]].to_dict("records")
        [{'id': 'a', 'winner': '1'}]
    """
    import pandas as pd

    got = read_parts(out)
    errors = [record for item, record in got.errors.items() if item not in got.verdicts]
    return pd.DataFrame([*got.verdicts.values(), *errors])


def absolute(path: str | None) -> str | None:
    """``path`` made absolute on the driver (workers run in directories of their own), or None."""
    return str(Path(path).absolute()) if path else None


def worker_env(cache_dir: str | None) -> None:
    """Point this worker's LM cache at ``cache_dir`` (``CHATEVAL_CACHE_DIR``) before the evaluator loads."""
    if cache_dir:
        os.environ["CHATEVAL_CACHE_DIR"] = str(cache_dir)
