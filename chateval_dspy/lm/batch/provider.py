"""What every batch provider offers the wave driver: submit a batch, read its state, read its outcomes.

All speak OpenAI's batch format (a chat-completions body under a ``custom_id`` in; a ``chat.completion`` or an error
out); a provider whose API differs (Anthropic's) translates inside itself, so driver, journal and engine never see it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from chateval_dspy.errors import FatalLMError
from chateval_dspy.limits import MAX_BATCH_RESULT_LINE_BYTES

log = logging.getLogger(__name__)

# A batch in one of these states will change no more: its outcomes can be read (some may be missing).
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


@dataclass(frozen=True)
class BatchRequest:
    """One call: ``body`` is an OpenAI chat-completions body; ``custom_id`` names it in the batch files."""

    custom_id: str
    body: dict


@dataclass(frozen=True)
class BatchState:
    """Where a submitted batch stands: ``status`` in OpenAI's words, ``{"total", "completed", "failed"}`` counts as
    far as the provider says, and ``detail`` (the provider's own word, or why it failed) for progress lines."""

    id: str
    status: str
    counts: dict = field(default_factory=dict)
    detail: str = ""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class Outcome:
    """What came back for one request of a finished batch: ``body`` (a ``chat.completion`` dict) or ``error``
    (``{"status": HTTP status or None, "code": str, "message": str}``)."""

    custom_id: str
    body: dict | None = None
    error: dict | None = None


class BatchProvider(Protocol):
    """A Batch API (or a folder a self-hosted engine reads).

    ``label`` is journalled *before* submitting: a provider that can tag a batch with it (OpenAI's ``metadata``)
    ``find``s it after a kill between submission and journal record (None: cannot tell), so a rerun attaches instead
    of submitting twice. ``outcomes`` reads a terminal batch (within ``limits.batch_result_bytes``) through
    ``asked_outcomes``; a request without an outcome is submitted again.
    """

    name: str

    def submit(self, requests: list[BatchRequest], label: str) -> str: ...

    def find(self, label: str) -> str | None: ...

    def state(self, batch_id: str) -> BatchState: ...

    def outcomes(self, batch_id: str, asked: Collection[str]) -> list[Outcome]: ...


# A failed request's message, as kept and shown: enough to say what went wrong, not a whole echoed prompt.
MAX_MESSAGE = 2000


def outcome_of(custom_id: str, record: dict, missing_status: int | None = None) -> Outcome:
    """The answer or error one line of an OpenAI-format batch output/error file holds (untrusted: a 200 without a
    JSON object body is an error too). ``missing_status``: a failure's status where it states none (None: OpenAI's
    ``batch_expired``; 502 for an engine whose batches never run out).

    Example:
        >>> outcome_of("r1", {"response": {"status_code": 200, "body": {"choices": []}}, "error": None}).body
        {'choices': []}
        >>> outcome_of("r2", {"response": {"status_code": 400, "body": None}, "error": "Request must not be streamed"}).error
        {'status': 400, 'code': 'request_failed', 'message': 'Request must not be streamed'}
        >>> outcome_of("r3", {"response": None, "error": {"code": "batch_expired", "message": "late"}}).error
        {'status': None, 'code': 'batch_expired', 'message': 'late'}
    """
    response = record.get("response") if isinstance(record.get("response"), dict) else {}
    status = response.get("status_code")
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    body, error = response.get("body"), record.get("error")
    if error is None and status == 200:
        if isinstance(body, dict):
            return Outcome(custom_id, body=body)
        return Outcome(custom_id, error={"status": status, "code": "invalid_response",
                                         "message": "the answer has no JSON object for a body"})
    if error is None and isinstance(body, dict):
        error = body.get("error")  # OpenAI's own files put a failed request's error in its body
    return Outcome(custom_id, error=error_of(status, error, missing_status))


def error_of(status: int | None, error: object, missing_status: int | None = None) -> dict:
    """``{"status", "code", "message"}`` from a provider's or an engine's error: a string, or an error object,
    flat or nested.

    Example:
        >>> error_of(None, {"error": {"message": "no such model", "type": "NotFoundError", "param": None, "code": 404}})
        {'status': 404, 'code': 'NotFoundError', 'message': 'no such model'}
    """
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]
    code, message = None, error if isinstance(error, str) else None
    if isinstance(error, dict):
        number = error.get("code")
        code = number if isinstance(number, str) else error.get("type")
        if status is None and isinstance(number, int) and not isinstance(number, bool):
            status = number
        message = error.get("message")
    if not isinstance(message, str) or not message:
        message = "the request failed" + (f" (HTTP {status})" if status is not None else "") + " and no more was said"
    return {"status": missing_status if status is None else status,
            "code": code[:80] if isinstance(code, str) and code else "request_failed", "message": message[:MAX_MESSAGE]}


def asked_outcomes(lines: Iterable[tuple[int, str, object]], asked: Collection[str], where: str,
                   parse: Callable[[str, object], Outcome | None]) -> list[Outcome]:
    """The outcomes that result ``lines`` (number, custom_id, raw) hold for the requests ``asked``; ``parse`` makes
    one of a line (None: unfinished). Lines for requests never asked are counted and warned of once; a request
    answered twice, differently, gets a ``conflicting_answers`` error, which sends it out again.

    Example:
        >>> ok = lambda cid, raw: Outcome(cid, body=raw)
        >>> [o.custom_id for o in asked_outcomes([(1, "a", {}), (2, "z", {}), (3, "b", {"x": 1}), (4, "b", {"x": 2})],
        ...                                      {"a", "b"}, "f", ok)]
        ['a', 'b']
        >>> asked_outcomes([(3, "b", {"x": 1}), (4, "b", {"x": 2})], {"b"}, "f", ok)[0].error["code"]
        'conflicting_answers'
    """
    asked = asked if isinstance(asked, (set, frozenset)) else set(asked)
    said: dict[str, object] = {}
    strangers, conflicting = 0, {}
    for number, custom_id, raw in lines:
        if custom_id not in asked:
            strangers += 1
        elif custom_id not in said:
            said[custom_id] = raw
        elif said[custom_id] != raw:
            conflicting.setdefault(custom_id, number)
    if strangers:
        log.warning("%s: %d line(s) answer requests this batch never asked; ignored", where, strangers)
    out = []
    for custom_id, raw in said.items():
        if custom_id in conflicting:
            log.warning("%s line %d: a second, different answer to %s; neither is kept, the request goes out again",
                        where, conflicting[custom_id], custom_id)
            out.append(Outcome(custom_id, error={"status": None, "code": "conflicting_answers",
                                                 "message": f"{where} answers it twice, differently"}))
        elif (outcome := parse(custom_id, raw)) is not None:
            out.append(outcome)
    return out


def capped_lines(chunks: Iterable[bytes], cap: int, where: str,
                 max_line: int = MAX_BATCH_RESULT_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    r"""(line number, bytes) of the non-blank lines in a stream of byte ``chunks``, refusing (``FatalLMError``
    naming ``where``) more than ``cap`` bytes in all or a line longer than ``max_line``: nothing longer is held.

    Example:
        >>> list(capped_lines([b'{"a"', b': 1}\n\n{"b": 2}'], 100, "results"))
        [(1, b'{"a": 1}'), (3, b'{"b": 2}')]
    """
    pending, total, number = bytearray(), 0, 0
    for chunk in chunks:
        total += len(chunk)
        if total > cap:
            raise FatalLMError(f"{where} is over the {cap}-byte cap for the batch's requests; refusing to read it")
        *complete, rest = chunk.split(b"\n")
        for part in complete:  # the first completes the pending line; a long line is never copied twice
            pending += part
            number += 1
            if len(pending) > max_line:
                raise FatalLMError(f"{where} line {number} is over the {max_line}-byte limit on one line")
            if pending.strip():
                yield number, bytes(pending)
            pending = bytearray()
        pending += rest
        if len(pending) > max_line:
            raise FatalLMError(f"{where} line {number + 1} is over the {max_line}-byte limit on one line")
    if pending.strip():
        yield number + 1, bytes(pending)
