"""The wave driver: the LM calls of every debate in a run gathered into batches, one batch per wave (why waves:
docs/cost.md, "Batch mode"). The run's threads are counted by a ``concurrency.Gate``: a thread that calls the LM is
*parked* until its answer is back, and when every thread is parked or ended the driver submits what it gathered.

Requests are named by a hash of their body (``request_id``), so identical calls go out once and a rerun recognises
its earlier calls: a journalled answer is given at once; a call in a batch still open waits for that batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from chateval_dspy.concurrency import Gate, current_gate
from chateval_dspy.errors import FatalLMError
from chateval_dspy.limits import MAX_BATCH_ANSWER_BYTES
from chateval_dspy.lm.batch.journal import Journal
from chateval_dspy.lm.batch.provider import BatchProvider, BatchRequest, BatchState, Outcome
from chateval_dspy.lm.pricing import Price, token_counts

log = logging.getLogger(__name__)


def request_id(body: dict) -> str:
    """The name of a request in batch files: ``c`` and a hash of its body (identical calls share it).

    Example:
        >>> request_id({"model": "m", "messages": []})
        'cf34244885bc2912271e20676d163d76ed27f7e80'
    """
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "c" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


@dataclass
class _Call:
    """One request and the threads waiting for it."""

    request: BatchRequest
    waiters: list[threading.Event] = field(default_factory=list)
    attempts: int = 0
    body: dict | None = None
    error: dict | None = None


class Waves:
    """The calls of a run, batched in waves through ``provider``, journaled in ``journal``.

    ``retries``: further waves a failed request may go out in (transient failure, or its batch expired or failed).
    ``on_progress`` gets a dict after each look at the batches: ``provider``, ``wave``, ``expected``, ``requests``,
    ``answered``, ``batches`` (each ``id``, ``status``, ``detail``, ``completed``, ``failed``, ``total``),
    ``submitted`` (by this process) and ``usd`` (of the answers so far at ``price``; None when unpriced).
    """

    def __init__(self, provider: BatchProvider, journal: Journal, *, retries: int = 2, poll_seconds: float = 30.0,
                 price: Price | None = None, on_progress: Callable[[dict], None] | None = None):
        self.provider, self.journal, self.retries, self.poll_seconds = provider, journal, retries, poll_seconds
        self.price, self.on_progress = price, on_progress
        self.wave, self.submitted, self.batch_ids = 0, 0, []
        self.expected: int | None = None  # the waves the run should take (set by its caller, shown in progress)
        self.usd: float | None = 0.0 if price is not None else None
        self._lock, self._wave_lock = threading.Lock(), threading.Lock()
        self._pending: dict[str, _Call] = {}
        self._drivers: dict[int, threading.Thread] = {}
        self._failure: BaseException | None = None

    def call(self, request: BatchRequest) -> dict:
        """The answer (a chat completion) to ``request``, or ``BatchCallError`` with the request's failure."""
        known = self.journal.answers.get(request.custom_id)
        if known is not None:
            return known
        gate = current_gate()
        if gate is None:  # a call outside a wave run (one item, a compile pass): a wave of its own
            return self._alone(request)
        event = threading.Event()
        with self._lock:
            call = self._pending.setdefault(request.custom_id, _Call(request))
            call.waiters.append(event)
            if id(gate) not in self._drivers:
                driver = threading.Thread(target=self._drive, args=(gate,), daemon=True, name="chateval-waves")
                self._drivers[id(gate)] = driver
                driver.start()
        gate.park()
        event.wait()
        return self._result(call)

    def _result(self, call: _Call) -> dict:
        if call.error is not None and call.error.get("fatal"):
            raise FatalLMError(f"batch mode stopped: {self._failure}") from self._failure
        if call.body is None:
            raise BatchCallError(call.error or {"status": None, "code": "unknown", "message": "no answer"})
        return call.body

    def _alone(self, request: BatchRequest) -> dict:
        call = _Call(request)
        with self._wave_lock:
            while call.body is None and call.error is None:
                self._run_wave({request.custom_id: call})
        return self._result(call)

    def _drive(self, gate: Gate) -> None:
        """Submit a wave each time every thread of ``gate`` is parked; end when they have all ended."""
        while True:
            gate.wait_quiet()
            with self._lock:
                calls, self._pending = self._pending, {}
                if not calls and gate.parked == 0 and gate.runnable <= 0:
                    self._drivers.pop(id(gate), None)
                    return
            if not calls:
                time.sleep(0.01)  # a thread counted parked is about to put its call in: look again
                continue
            try:
                with self._wave_lock:
                    self._run_wave(calls)
            except BaseException as exc:  # the provider failed for good: every waiting call learns it
                log.error("batch mode stopped: %s", exc)
                self._failure = exc
                for call in calls.values():
                    if call.body is None:
                        call.error = {"status": None, "code": "batch_mode_stopped", "message": str(exc), "fatal": True}
            self._deliver(gate, calls)

    def _deliver(self, gate: Gate, calls: dict[str, _Call]) -> None:
        again = {cid: c for cid, c in calls.items() if c.body is None and c.error is None}
        done = [c for c in calls.values() if c.body is not None or c.error is not None]
        with self._lock:
            self._pending.update(again)  # nobody is runnable: no new call can have come in meanwhile
        gate.unpark(sum(len(c.waiters) for c in done))
        for c in done:
            for event in c.waiters:
                event.set()

    def _run_wave(self, calls: dict[str, _Call]) -> None:
        """Submit (or attach to) the batches that answer ``calls``, wait for them, and settle each call."""
        self.wave += 1
        labels = self._submit(calls)
        states = self._wait(labels, calls)
        outcomes: dict[str, Outcome] = {}
        for label, state in states.items():
            # Only the batch's own requests: an answer to anything else is no answer of this run's.
            asked = set(self.journal.batches[label].custom_ids)
            for outcome in self.provider.outcomes(state.id, asked):
                if outcome.custom_id not in asked:
                    continue
                outcomes.setdefault(outcome.custom_id, outcome)
                if outcome.body is not None:
                    self._keep(outcome)
            self.journal.ended(label)
        for cid, call in calls.items():
            self._settle(call, outcomes.get(cid), states)

    def _submit(self, calls: dict[str, _Call]) -> list[str]:
        """The labels of the batches this wave waits for: open ones from the journal, and one new batch."""
        labels, fresh = [], []
        for cid, call in calls.items():
            if cid in self.journal.answers:
                call.body = self.journal.answers[cid]
                continue
            open_batch = self.journal.open_batch_of(cid)
            if open_batch is not None and (open_batch.id or self._found(open_batch.label)):
                labels.append(open_batch.label)
            else:
                fresh.append(call.request)
        labels = list(dict.fromkeys(labels))
        if fresh:
            label = f"w{self.wave:04d}-{uuid.uuid4().hex[:12]}"
            self.journal.intent(label, self.wave, fresh)
            batch_id = self.provider.submit(fresh, label)
            self.journal.submitted(label, batch_id)
            self.submitted += len(fresh)
            labels.append(label)
        self.batch_ids += [self.journal.batches[label].id for label in labels]
        return labels

    def _found(self, label: str) -> bool:
        """Whether a batch journaled as about to be submitted reached the provider (a kill came in between)."""
        batch_id = self.provider.find(label)
        if batch_id is not None:
            self.journal.submitted(label, batch_id)
        else:  # never reached the provider: its calls go out in a new batch, and this one is closed
            self.journal.ended(label)
        return batch_id is not None

    def _wait(self, labels: list[str], calls: dict[str, _Call]) -> dict[str, BatchState]:
        states = {label: self.provider.state(self.journal.batches[label].id) for label in labels}
        while True:
            if self.on_progress is not None:
                self.on_progress({
                    "provider": self.provider.name, "wave": self.wave, "expected": self.expected, "requests": len(calls),
                    "submitted": self.submitted, "usd": self.usd,
                    "answered": sum(1 for c in calls.values() if c.body is not None),
                    "batches": [{"id": s.id, "status": s.status, "detail": s.detail, **s.counts} for s in states.values()]})
            if all(s.terminal for s in states.values()):
                return states
            time.sleep(self.poll_seconds)
            states = {label: s if s.terminal else self.provider.state(s.id) for label, s in states.items()}

    def _keep(self, outcome: Outcome) -> None:
        if len(json.dumps(outcome.body)) > MAX_BATCH_ANSWER_BYTES:
            return  # settled as a failed request below: the answer is not one
        self.journal.answer(outcome.custom_id, outcome.body)
        if self.price is not None and isinstance(outcome.body.get("usage"), dict):
            used = token_counts(outcome.body["usage"])
            self.usd = round(self.usd + self.price.usd(used.prompt_tokens, used.completion_tokens,
                                                       cached_prompt_tokens=used.cached_prompt_tokens,
                                                       cache_write_tokens=used.cache_write_tokens), 10)

    def _settle(self, call: _Call, outcome: Outcome | None, states: dict[str, BatchState]) -> None:
        """A call's answer, its failure, or (a transient failure with retries left) nothing: it goes out again."""
        if call.body is not None:
            return
        if outcome is not None and outcome.body is not None and outcome.custom_id in self.journal.answers:
            call.body = outcome.body
            return
        if outcome is not None and outcome.body is not None:
            error = {"status": 502, "code": "answer_too_large",
                     "message": f"an answer over {MAX_BATCH_ANSWER_BYTES} bytes"}
        elif outcome is not None:
            error = outcome.error or {"status": None, "code": "unknown", "message": "no answer"}
        else:
            ended = ",".join(sorted({s.status for s in states.values()})) or "unknown"
            error = {"status": None, "code": f"batch_{ended}", "message": f"the batch ended {ended} before answering"}
        status = error.get("status")  # none said, or one a live call would retry: it goes into the next wave again
        if (status is None or status in (408, 409, 429) or (isinstance(status, int) and status >= 500)) \
                and call.attempts < self.retries:
            call.attempts += 1
            log.warning("request %s: %s; it goes out again in the next wave (%d of %d)", call.request.custom_id,
                        error.get("code"), call.attempts, self.retries)
            return
        call.error = error


class BatchCallError(Exception):
    """A request that failed inside a batch (after its retries): ``error`` holds its status, code and message."""

    def __init__(self, error: dict):
        super().__init__(f"{error.get('code')}: {str(error.get('message'))[:300]}")
        self.error = error
