"""OpenAI's Batch API (Files + Batches), for OpenAI and any OpenAI-compatible server that implements ``/v1/batches``.

Each batch is one uploaded JSONL file of chat-completions requests; its output and error files are read back
when it ends. The batch carries the driver's label in its ``metadata``, so that a batch submitted just before a
kill is found again (``find``) rather than submitted twice.
"""

from __future__ import annotations

import json

import openai

from chateval_dspy.errors import FatalLMError
from chateval_dspy.lm.batch.provider import BatchRequest, BatchState, Outcome, outcome_of

LABEL_KEY = "chateval_label"
# An output file holds a wave's answers: tens of thousands of chat completions at most.
MAX_OUTPUT_BYTES = 512 * 1024 * 1024


class OpenAIBatches:
    """Batches through ``base_url`` (``https://api.openai.com/v1`` or a server's ``.../v1``) with ``api_key``.

    The key lives in the client only: never in a repr, a log line, an error or the journal.
    """

    name = "openai"

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, timeout=timeout, max_retries=3)

    def __repr__(self) -> str:
        return f"OpenAIBatches(base_url={self.base_url!r})"

    def submit(self, requests: list[BatchRequest], label: str) -> str:
        lines = "".join(json.dumps({"custom_id": r.custom_id, "method": "POST", "url": "/v1/chat/completions",
                                    "body": r.body}, ensure_ascii=False) + "\n" for r in requests)
        try:
            uploaded = self.client.files.create(file=(f"{label}.jsonl", lines.encode("utf-8")), purpose="batch")
            batch = self.client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                               completion_window="24h", metadata={LABEL_KEY: label})
        except openai.APIError as exc:
            raise FatalLMError(f"{self.base_url}: could not submit batch {label}: {_reason(exc)}") from exc
        return batch.id

    def find(self, label: str) -> str | None:
        try:
            for batch in self.client.batches.list(limit=100):
                if (batch.metadata or {}).get(LABEL_KEY) == label:
                    return batch.id
        except openai.APIError as exc:
            raise FatalLMError(f"{self.base_url}: could not list batches: {_reason(exc)}") from exc
        return None

    def state(self, batch_id: str) -> BatchState:
        batch = self._retrieve(batch_id)
        counts = batch.request_counts
        errors = "; ".join(str(e.message)[:200] for e in (getattr(batch.errors, "data", None) or [])[:3])
        return BatchState(batch.id, batch.status, {"total": counts.total, "completed": counts.completed,
                                                   "failed": counts.failed} if counts else {}, errors or batch.status)

    def outcomes(self, batch_id: str) -> list[Outcome]:
        batch = self._retrieve(batch_id)
        out = []
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                text = self._content(batch_id, file_id)
                out += [_outcome(line, f"batch {batch_id} file {file_id} line {n}")
                        for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
        return out

    def _retrieve(self, batch_id: str):
        try:
            return self.client.batches.retrieve(batch_id)
        except openai.APIError as exc:
            raise FatalLMError(f"{self.base_url}: could not read batch {batch_id}: {_reason(exc)}") from exc

    def _content(self, batch_id: str, file_id: str) -> str:
        try:
            with self.client.files.with_streaming_response.content(file_id) as response:
                data = bytearray()
                for chunk in response.iter_bytes():
                    data.extend(chunk)
                    if len(data) > MAX_OUTPUT_BYTES:
                        raise FatalLMError(f"{self.base_url}: batch {batch_id}'s file {file_id} is larger than "
                                      f"{MAX_OUTPUT_BYTES} bytes; refusing to read it")
        except openai.APIError as exc:
            raise FatalLMError(f"{self.base_url}: could not read file {file_id} of batch {batch_id}: {_reason(exc)}") from exc
        return bytes(data).decode("utf-8", errors="replace")


def _reason(exc: openai.APIError) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status else type(exc).__name__


def _outcome(line: str, where: str) -> Outcome:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise FatalLMError(f"{where}: not JSON ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("custom_id"), str):
        raise FatalLMError(f"{where}: not a batch output line (no string custom_id)")
    return outcome_of(record["custom_id"], record)
