"""Threads that keep DSPy's settings (the LM, adapter and usage tracker live in contextvars), and the gate that
tells a batching LM when every thread of a run is waiting on it."""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def _submit(pool: ThreadPoolExecutor, fn: Callable[[T], R], item: T) -> Future:
    # One copied context per task: a Context cannot be entered by two threads at once.
    return pool.submit(contextvars.copy_context().run, fn, item)


def parallel_map(fn: Callable[[T], R], items: list[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``workers`` threads, results in input order."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    gate = current_gate()
    if gate is not None:
        return _gated_map(gate, fn, items)
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        return [f.result() for f in [_submit(pool, fn, x) for x in items]]


def bounded_unordered(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[tuple[T, R]]:
    """Yield ``(item, fn(item))`` as each finishes, never more than ``workers`` in flight.

    Items are drawn from ``items`` lazily, so a long input is never all queued at once.
    """
    if workers <= 1:
        for x in items:
            yield x, fn(x)
        return
    it = iter(items)
    with ThreadPoolExecutor(workers) as pool:
        pending: dict[Future, T] = {}
        for x in it:
            pending[_submit(pool, fn, x)] = x
            if len(pending) >= workers:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                x = pending.pop(f)
                yield x, f.result()
                nxt = next(it, _END)
                if nxt is not _END:
                    pending[_submit(pool, fn, nxt)] = nxt


_END = object()


class Gate:
    """Counts the threads of a run that may still make an LM call, so that a batching LM knows when every one
    of them is waiting on it (``chateval_dspy.lm.batch``): then the calls gathered so far are all the calls
    that can be made now, and go out as one wave.

    A thread counts from the moment it is started (``add`` before it runs) until it ends (``done``) or waits
    for an answer (``park``; ``unpark`` counts it again before it is woken). ``parallel_map`` keeps the count
    while a thread waits for the threads it started: its own count passes to them and back.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.runnable = 0
        self.parked = 0

    def add(self, n: int = 1) -> None:
        with self._cond:
            self.runnable += n

    def done(self, n: int = 1) -> None:
        with self._cond:
            self.runnable -= n
            self._cond.notify_all()

    def park(self) -> None:
        with self._cond:
            self.runnable -= 1
            self.parked += 1
            self._cond.notify_all()

    def unpark(self, n: int) -> None:
        with self._cond:
            self.runnable += n
            self.parked -= n

    def wait_quiet(self, stop: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until no thread could still call (or ``stop()``); whether that came before ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self.runnable <= 0 or stop(), timeout)

    def wake(self) -> None:
        """Make ``wait_quiet`` look again (``stop()`` may have changed)."""
        with self._cond:
            self._cond.notify_all()


_GATE: contextvars.ContextVar[Gate | None] = contextvars.ContextVar("chateval_gate", default=None)


def current_gate() -> Gate | None:
    """The gate of the wave run this thread belongs to, or None (a live run)."""
    return _GATE.get()


def _gated_map(gate: Gate, fn: Callable[[T], R], items: list[T]) -> list[R]:
    # The caller's count passes to its children (all started at once: a queued child could never run while the
    # others wait for a wave that waits for it), and back to the caller with the last child to end.
    left = [len(items)]
    lock = threading.Lock()

    def child(x: T) -> R:
        try:
            return fn(x)
        finally:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if not last:
                gate.done()

    gate.add(len(items) - 1)
    with ThreadPoolExecutor(len(items)) as pool:
        return [f.result() for f in [_submit(pool, child, x) for x in items]]


def run_gated(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[tuple[T, R]]:
    """``bounded_unordered`` for a wave run: ``(item, fn(item))`` as each finishes, under a new ``Gate``.

    ``workers`` threads each judge item after item, so a finished item's thread takes the next one before the
    gate could see it idle (its next item's first call joins the wave being gathered, not one of its own).
    """
    gate, it, lock = Gate(), iter(items), threading.Lock()
    results: queue.Queue = queue.Queue()

    def worker() -> None:
        try:
            while True:
                with lock:
                    x = next(it, _END)
                if x is _END:
                    return
                try:
                    results.put((x, fn(x), None))
                except BaseException as exc:  # handed to the consumer, which raises it
                    results.put((x, None, exc))
                    return
        finally:
            gate.done()
            results.put(_END)

    token = _GATE.set(gate)
    try:
        gate.add(workers)
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(worker,), daemon=True,
                                    name=f"chateval-wave-{i}") for i in range(workers)]
    finally:
        _GATE.reset(token)
    yield from _drain(threads, results)


def _drain(threads: list[threading.Thread], results: queue.Queue) -> Iterator[tuple]:
    for t in threads:
        t.start()
    running = len(threads)
    while running:
        got = results.get()
        if got is _END:
            running -= 1
            continue
        x, value, exc = got
        if exc is not None:
            raise exc
        yield x, value
