"""OpenAI's Batch API (Files + Batches), for OpenAI and any OpenAI-compatible server that implements ``/v1/batches``.

Each batch is one uploaded JSONL file of chat-completions requests; its output and error files are read back
when it ends. The batch carries the driver's label in its ``metadata``, so that a batch submitted just before a
kill is found again (``find``) rather than submitted twice.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator

import httpx
import openai

from chateval_dspy.errors import FatalLMError
from chateval_dspy.limits import MAX_BATCH_LIST_PAGES, batch_result_bytes
from chateval_dspy.lm.batch.provider import BatchRequest, BatchState, Outcome, asked_outcomes, capped_lines, outcome_of

LABEL_KEY = "chateval_label"
LIST_PAGE = 100  # batches per page of the list ``find`` reads (the API's most)


class OpenAIBatches:
    """Batches through ``base_url`` (OpenAI's or a server's ``.../v1``); ``api_key`` lives in the client only."""

    name = "openai"

    def __init__(self, base_url: str, api_key: str):
        self.base_url = base_url.rstrip("/")
        # No redirects: an answer may not choose where requests, files and the key go (a 3xx is an error).
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, timeout=120.0, max_retries=3,
                                    http_client=openai.DefaultHttpxClient(follow_redirects=False))

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
        """The batch carrying ``label``, looked for among the newest ``MAX_BATCH_LIST_PAGES`` pages of batches; a
        list that goes on past them, or repeats itself, is an error rather than a batch submitted twice."""
        after, seen = None, set()
        try:
            for _ in range(MAX_BATCH_LIST_PAGES):
                page = self.client.batches.list(limit=LIST_PAGE, **({"after": after} if after else {}))
                for batch in page.data:
                    if (batch.metadata or {}).get(LABEL_KEY) == label:
                        return batch.id
                ids = [batch.id for batch in page.data]
                if not page.has_more or not ids:
                    return None
                if seen.intersection(ids):
                    raise FatalLMError(f"{self.base_url}: the list of batches repeats itself (batch {ids[-1][:80]!r} "
                                       f"again) while looking for batch {label}; stopping rather than submit it twice")
                seen.update(ids)
                after = ids[-1]
        except openai.APIError as exc:
            raise FatalLMError(f"{self.base_url}: could not list batches: {_reason(exc)}") from exc
        raise FatalLMError(f"{self.base_url}: batch {label} is not among the newest {len(seen)} batches and the list "
                           "goes on; stopping rather than submit it twice: cancel it there if it exists, and move "
                           "the results file's .batches folder away to start its batches afresh")

    def state(self, batch_id: str) -> BatchState:
        batch = self._retrieve(batch_id)
        counts = batch.request_counts
        errors = "; ".join(str(e.message)[:200] for e in (getattr(batch.errors, "data", None) or [])[:3])
        return BatchState(batch.id, batch.status, {"total": counts.total, "completed": counts.completed,
                                                   "failed": counts.failed} if counts else {}, errors or batch.status)

    def outcomes(self, batch_id: str, asked: Collection[str]) -> list[Outcome]:
        """The ``BatchProvider`` outcomes its output and error files hold, each file streamed in within the cap."""
        batch = self._retrieve(batch_id)
        files = [f for f in (batch.output_file_id, batch.error_file_id) if f]
        lines = self._lines(batch_id, files, batch_result_bytes(len(asked)))
        return asked_outcomes(lines, asked, f"{self.base_url}: batch {batch_id}", outcome_of)

    def _retrieve(self, batch_id: str):
        try:
            return self.client.batches.retrieve(batch_id)
        except openai.APIError as exc:
            raise FatalLMError(f"{self.base_url}: could not read batch {batch_id}: {_reason(exc)}") from exc

    def _lines(self, batch_id: str, file_ids: list[str], cap: int) -> Iterator[tuple[int, str, dict]]:
        """(line number, custom_id, record) of each line of the files, each streamed in within ``cap`` bytes."""
        for file_id in file_ids:
            where = f"{self.base_url}: batch {batch_id} file {file_id}"
            try:
                with self.client.files.with_streaming_response.content(file_id) as response:
                    for number, line in capped_lines(response.iter_bytes(), cap, where):
                        yield number, *_custom_id(line, f"{where} line {number}")
            except (openai.APIError, httpx.HTTPError) as exc:
                raise FatalLMError(f"{self.base_url}: could not read file {file_id} of batch {batch_id}: "
                                   f"{_reason(exc)}") from exc


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 300 <= status < 400:
        location = " ".join(str(exc.response.headers.get("location") or "(no Location)").split())[:200]
        return f"HTTP {status}, a redirect to {location!r}, not followed (an answer may not choose the endpoint)"
    return f"HTTP {status}" if status else type(exc).__name__


def _custom_id(line: bytes, where: str) -> tuple[str, dict]:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise FatalLMError(f"{where}: not JSON ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("custom_id"), str):
        raise FatalLMError(f"{where}: not a batch output line (no string custom_id)")
    return record["custom_id"], record
