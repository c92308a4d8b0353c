"""Batches as files in a folder, for a self-hosted engine: a wave's requests go to ``<label>.input.jsonl`` and its
answers are read from ``<label>.output.jsonl``, which vLLM's offline runner writes (``FolderBatches.command``).

Both are OpenAI's batch JSONL as vLLM's ``run_batch`` reads and writes it; the wave is done when the output answers
every request. The folder is shared with whoever runs the engine, so its files are untrusted: each is opened as
itself (a link, pipe or device is refused) and read within ``limits.batch_result_bytes`` of its wave's requests.

Example:
    >>> from chateval_dspy.lm.batch.provider import BatchRequest
    >>> folder = FolderBatches(tmp / "waves", model="Qwen/Qwen2.5-7B")
    >>> folder.submit([BatchRequest("r1", {"messages": [{"role": "user", "content": "Hi"}]})], "wave-1")
    'wave-1'
    >>> folder.state("wave-1").detail.split(";")[0]
    'waiting for .../waves/wave-1.output.jsonl'
    >>> print(folder.command("wave-1"))
    python -m vllm.entrypoints.openai.run_batch -i .../wave-1.input.jsonl -o .../wave-1.output.jsonl --model Qwen/Qwen2.5-7B
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Collection, Iterator
from pathlib import Path

from chateval_dspy.errors import ConfigError, FatalLMError
from chateval_dspy.files import open_regular, write_atomic
from chateval_dspy.limits import MAX_BATCH_RESULT_LINE_BYTES, batch_result_bytes
from chateval_dspy.lm.batch.provider import BatchRequest, BatchState, Outcome, asked_outcomes, outcome_of

# The engine's output is untrusted and may be huge: past these sizes we refuse it rather than fill memory.
MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_LINE_BYTES = 16 * 1024 * 1024

_URL = "/v1/chat/completions"
_LABEL = re.compile(r"[A-Za-z0-9_.-]{1,200}")
# A failure that states no status: this engine's batches never run out, so it is the engine's own fault.
NO_STATUS = 502


class FolderBatches:
    """A ``BatchProvider`` whose batches are files in ``directory``, run by hand (or by a job) with vLLM.

    ``model`` (the engine's served name) replaces each body's ``model`` (vLLM answers 404 to any other) and goes
    into ``command``; None keeps the bodies' own. ``max_file_bytes``/``max_line_bytes`` bound a wave's files and lines.
    """

    name = "folder"

    def __init__(self, directory: str | Path, model: str | None = None, *, max_file_bytes: int = MAX_FILE_BYTES,
                 max_line_bytes: int = MAX_LINE_BYTES):
        self.directory = Path(directory)
        self.model = model
        self.max_file_bytes, self.max_line_bytes = max_file_bytes, max_line_bytes
        self._ids: dict[str, list[str]] = {}  # an input never changes once written, so it is read once

    def input_path(self, batch_id: str) -> Path:
        return self.directory / f"{_checked(batch_id)}.input.jsonl"

    def output_path(self, batch_id: str) -> Path:
        return self.directory / f"{_checked(batch_id)}.output.jsonl"

    def submit(self, requests: list[BatchRequest], label: str) -> str:
        """Write the wave's input file (whole or not at all); its batch id is ``label``. The same requests again
        under the same label are a no-op; different ones are refused."""
        path, data = self.input_path(label), self._input_bytes(requests)
        if os.path.lexists(path):
            with os.fdopen(open_regular(path, os.O_RDONLY, "batch input"), "rb") as f:
                same = f.read(len(data) + 1) == data  # at most one byte more than ours: more means it differs
            if not same:
                raise ConfigError(f"{path} already holds a different wave: remove it, or use another batch folder")
            return label
        if os.path.lexists(self.output_path(label)):
            # It cannot answer an input that did not exist yet: reading it would hand back another run's answers.
            raise ConfigError(f"{self.output_path(label)} is left from an earlier run: remove it, or use another batch folder")
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        self._ids.pop(label, None)  # a label reused after its old files were removed
        return label

    def find(self, label: str) -> str | None:
        """``label`` if its wave's input file is there (a rerun after a kill attaches to it), else None."""
        return label if os.path.lexists(self.input_path(label)) else None

    def command(self, batch_id: str) -> str:
        """The shell command that runs the wave with vLLM's offline batch runner."""
        model = self.model or self._input_model(batch_id)
        paths = [os.path.abspath(self.input_path(batch_id)), os.path.abspath(self.output_path(batch_id))]
        return shlex.join(["python", "-m", "vllm.entrypoints.openai.run_batch", "-i", paths[0], "-o", paths[1],
                           "--model", model])

    def state(self, batch_id: str) -> BatchState:
        """``completed`` once the output answers every request of the input; ``in_progress`` until then."""
        ids, out = self._input_ids(batch_id), self.output_path(batch_id)
        counts = {"total": len(ids), "completed": 0, "failed": 0}
        if not os.path.lexists(out):
            # Said at every look, so that whoever runs the engine sees which command answers the wave.
            return BatchState(batch_id, "in_progress", counts, f"waiting for {out}; run: {self.command(batch_id)}")
        wanted, seen = set(ids), set()
        for number, record in self._read_output(out, len(ids)):
            custom_id = _custom_id(out, number, record)
            if custom_id in wanted and custom_id not in seen:
                seen.add(custom_id)
                counts["failed" if outcome_of(custom_id, record, NO_STATUS).error else "completed"] += 1
        if len(seen) == len(ids):
            return BatchState(batch_id, "completed", counts, f"{out} answers all {len(ids)} requests")
        return BatchState(batch_id, "in_progress", counts, f"{len(seen)} of {len(ids)} answers in {out} so far")

    def outcomes(self, batch_id: str, asked: Collection[str]) -> list[Outcome]:
        """The ``BatchProvider`` outcomes: one per output line that answers a request of ``asked``."""
        out = self.output_path(batch_id)
        if not os.path.lexists(out):
            return []
        lines = ((number, _custom_id(out, number, record), record)
                 for number, record in self._read_output(out, len(asked)))
        return asked_outcomes(lines, asked, str(out), lambda custom_id, record: outcome_of(custom_id, record, NO_STATUS))

    def _read_output(self, path: Path, requests: int) -> Iterator[tuple[int, dict]]:
        cap = min(self.max_file_bytes, batch_result_bytes(requests))
        return _records(path, cap, min(self.max_line_bytes, MAX_BATCH_RESULT_LINE_BYTES), f" for its {requests} requests")

    def _input_bytes(self, requests: list[BatchRequest]) -> bytes:
        lines, seen = [], set()
        for request in requests:
            if not isinstance(request.custom_id, str) or not request.custom_id or request.custom_id in seen:
                raise ValueError(f"custom_id {request.custom_id!r} is empty, not a string, or not unique in the wave")
            seen.add(request.custom_id)
            body = {**request.body, "model": self.model} if self.model else request.body
            line = json.dumps({"custom_id": request.custom_id, "method": "POST", "url": _URL, "body": body}) + "\n"
            if len(line) > self.max_line_bytes:  # ASCII (json.dumps escapes the rest), so characters are bytes
                raise ConfigError(f"request {request.custom_id!r} is {len(line)} bytes, over the {self.max_line_bytes}-byte "
                                  "limit")
            lines.append(line)
        data = "".join(lines).encode("ascii")
        if len(data) > self.max_file_bytes:  # state() could not read it back
            raise ConfigError(f"the wave is {len(data)} bytes, over the {self.max_file_bytes}-byte limit: submit smaller "
                              "waves")
        return data

    def _input_ids(self, batch_id: str) -> list[str]:
        if batch_id not in self._ids:
            path, records = self._input_records(batch_id)
            self._ids[batch_id] = [_custom_id(path, number, record) for number, record in records]
        return self._ids[batch_id]

    def _input_model(self, batch_id: str) -> str:
        path, records = self._input_records(batch_id)
        models = {(record.get("body") or {}).get("model") for _, record in records}
        model = models.pop() if len(models) == 1 else None
        if not isinstance(model, str) or not model:
            raise ConfigError(f"the requests in {path} do not name one model: give FolderBatches the model the engine serves")
        return model

    def _input_records(self, batch_id: str) -> tuple[Path, Iterator[tuple[int, dict]]]:
        path = self.input_path(batch_id)
        if not os.path.lexists(path):
            raise ConfigError(f"no batch {batch_id!r} in {self.directory}: {path} is missing")
        return path, _records(path, self.max_file_bytes, self.max_line_bytes)


def _checked(label: str) -> str:
    # The label becomes a file name: nothing that could climb out of the folder or hide from a listing.
    if not isinstance(label, str) or not _LABEL.fullmatch(label) or label.startswith("."):
        raise ConfigError(f"batch label {label!r} is no safe file name: use up to 200 of A-Z a-z 0-9 _ . - "
                          "and do not start it with '.'")
    return label


def _records(path: Path, max_file_bytes: int, max_line_bytes: int, whose: str = "") -> Iterator[tuple[int, dict]]:
    """(line number, object) for each line of ``path``; a last line the engine is still writing is left out."""
    with os.fdopen(open_regular(path, os.O_RDONLY, "batch file"), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_file_bytes:
            raise FatalLMError(f"{path} is {size} bytes, over the {max_file_bytes}-byte limit on a batch file{whose}")
        number = total = 0
        while line := f.readline(max_line_bytes + 1):
            number, total = number + 1, total + len(line)
            whole = line.endswith(b"\n")
            if total > max_file_bytes:  # it grew while we read it
                raise FatalLMError(f"{path} grew past the {max_file_bytes}-byte limit on a batch file{whose} "
                                   f"(line {number})")
            if not whole and len(line) > max_line_bytes:
                raise FatalLMError(f"{path} line {number} is over the {max_line_bytes}-byte limit on one line")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                if not whole:
                    return  # torn: the engine has written only part of it so far
                raise FatalLMError(f"{path} line {number} is not JSON: {exc}") from None
            if not isinstance(record, dict):
                raise FatalLMError(f"{path} line {number} is not a JSON object")
            yield number, record


def _custom_id(path: Path, number: int, record: dict) -> str:
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str):
        # Without it the line answers no request, and the wave would wait for it forever.
        raise FatalLMError(f"{path} line {number} has no string custom_id")
    return custom_id
