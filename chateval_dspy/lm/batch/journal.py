"""What a batch run has submitted and received, kept beside its results so that a rerun pays for nothing twice.

A folder (``<results file>.batches/`` by default) holds:

- ``journal.jsonl``: events ``intent`` (label, wave, request ids; written *before* submitting), ``submitted``
  (the provider's batch id for a label) and ``ended`` (outcomes read);
- ``<label>.input.jsonl``: each batch's requests, in OpenAI's batch input format;
- ``answers.jsonl``: every answer received, by request id.

Lines are appended whole, flushed and fsynced; a torn last line is ignored. A line read back that this module did
not write (or an unasked or second, different answer) is an error naming file and line; a link, pipe or device in
place of its files is refused (``files.open_regular``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from chateval_dspy.errors import ConfigError
from chateval_dspy.files import open_regular, write_atomic
from chateval_dspy.lm.batch.provider import BatchRequest

JOURNAL, ANSWERS = "journal.jsonl", "answers.jsonl"
# Request ids are ``c`` + hex (``request_id``); labels are ``w<wave>-<hex>``: both are safe file names.
ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# One answer is a chat completion of at most a few thousand tokens; a line this long is not one.
MAX_LINE_BYTES = 4 * 1024 * 1024


@dataclass
class Submitted:
    """A batch in the journal: its label, request ids, and (once known) the provider's id and end."""

    label: str
    custom_ids: list[str]
    id: str | None = None
    ended: bool = False


@dataclass
class Journal:
    """The journal folder of one results file (created on first write).

    Example:
        >>> j = Journal(tmp / "r.jsonl.batches")
        >>> j.intent("w0001-ab", 1, [BatchRequest("c1", {"model": "m"})])
        >>> j.submitted("w0001-ab", "batch_1"); j.answer("c1", {"choices": []})
        >>> again = Journal(tmp / "r.jsonl.batches")
        >>> again.batches["w0001-ab"].id, again.answers["c1"]
        ('batch_1', {'choices': []})
    """

    folder: Path
    batches: dict[str, Submitted] = field(default_factory=dict)
    answers: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self._lock = threading.Lock()
        if self.folder.is_symlink():
            raise ConfigError(f"batch journal {self.folder} is a symbolic link; refusing to write through it: give "
                              "the results file another path")
        for event in _lines(self.folder / JOURNAL):
            self._replay(event)
        asked = {cid for batch in self.batches.values() for cid in batch.custom_ids}
        for number, line in enumerate(_lines(self.folder / ANSWERS), start=1):
            # This program journals one answer per request it asked: anything else was put there.
            cid, body = line.get("custom_id"), line.get("body")
            problem = ("" if not isinstance(cid, str) or not ID_PATTERN.match(cid) or not isinstance(body, dict)
                       else f" (no journaled batch asked {cid})" if cid not in asked
                       else f" (a second, different answer to {cid})" if self.answers.setdefault(cid, body) != body
                       else None)
            if problem is not None:
                raise ConfigError(f"{self.folder / ANSWERS} line {number}: not an answer this program wrote"
                                  f"{problem}; move the folder away to start the batches afresh")

    def _replay(self, event: dict) -> None:
        kind, label = event.get("event"), event.get("label")
        if not isinstance(label, str) or not ID_PATTERN.match(label):
            raise ConfigError(f"{self.folder / JOURNAL}: an event without a valid label: {str(event)[:120]}")
        if kind == "intent":
            ids, wave = event.get("custom_ids"), event.get("wave")
            if not isinstance(ids, list) or not all(isinstance(i, str) and ID_PATTERN.match(i) for i in ids) \
                    or not isinstance(wave, int):
                raise ConfigError(f"{self.folder / JOURNAL}: intent {label!r} lists invalid request ids")
            self.batches[label] = Submitted(label, ids)
        elif kind in ("submitted", "ended") and label in self.batches:
            batch = self.batches[label]
            if kind == "submitted" and isinstance(event.get("id"), str):
                batch.id = event["id"][:200]
            batch.ended = batch.ended or kind == "ended"
        else:
            raise ConfigError(f"{self.folder / JOURNAL}: unknown event {str(event)[:120]}")

    def intent(self, label: str, wave: int, requests: list[BatchRequest]) -> None:
        """Record a batch about to be submitted, with its requests' input file."""
        ids = [r.custom_id for r in requests]
        lines = "".join(json.dumps({"custom_id": r.custom_id, "method": "POST", "url": "/v1/chat/completions",
                                    "body": r.body}, ensure_ascii=False) + "\n" for r in requests)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.folder / f"{label}.input.jsonl", lines.encode("utf-8"))
        self._append(self.folder / JOURNAL, {"event": "intent", "label": label, "wave": wave, "custom_ids": ids})
        self.batches[label] = Submitted(label, ids)

    def submitted(self, label: str, batch_id: str) -> None:
        self._append(self.folder / JOURNAL, {"event": "submitted", "label": label, "id": batch_id})
        self.batches[label].id = batch_id

    def ended(self, label: str) -> None:
        self._append(self.folder / JOURNAL, {"event": "ended", "label": label})
        self.batches[label].ended = True

    def answer(self, custom_id: str, body: dict) -> None:
        """Keep an answer (the first one for an id wins, as when it was read back)."""
        with self._lock:
            if custom_id in self.answers:
                return
            self.answers[custom_id] = body
        self._append(self.folder / ANSWERS, {"custom_id": custom_id, "body": body})

    def open_batch_of(self, custom_id: str) -> Submitted | None:
        """The journaled batch not yet ended that holds ``custom_id`` (a rerun attaches to it), or None."""
        return next((b for b in self.batches.values() if not b.ended and custom_id in b.custom_ids), None)

    def _append(self, path: Path, line: dict) -> None:
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "batch journal file", sole=True)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())


def _lines(path: Path) -> list[dict]:
    """The whole lines of a journal file, each a JSON object; a torn last line is left out (and cut off)."""
    try:
        fd = open_regular(path, os.O_RDWR, "batch journal file", sole=True)
    except FileNotFoundError:
        return []
    out = []
    with os.fdopen(fd, "r+b") as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_LINE_BYTES:
                    raise ConfigError(f"{path}: line {number} is longer than {MAX_LINE_BYTES} bytes")
                # The last line of a write cut short by a kill: cut off, so that the next append starts a line.
                f.truncate(f.tell() - len(raw))
                break
            try:
                line = json.loads(raw)
            except ValueError as exc:
                raise ConfigError(f"{path}: line {number} is not JSON ({exc})") from exc
            if not isinstance(line, dict):
                raise ConfigError(f"{path}: line {number} is not a JSON object")
            out.append(line)
    return out
