"""Threads that keep DSPy's settings (the LM, adapter and usage tracker live in contextvars), the gate that tells a
batching LM when every thread of a run is waiting on it, and the slots that bound a run's LM calls in flight.

``n`` items at once make up to ``n x orders x referees`` calls together (``parallel_map`` within each item);
``call_slots(k)`` bounds that product to ``k`` working threads (``CallSlots``).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


@contextlib.contextmanager
def set_within(var: contextvars.ContextVar, value: T) -> Iterator[T]:
    """``var`` set to ``value`` within the block (and the threads that copy its context); yields ``value``."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def _submit(pool: ThreadPoolExecutor, fn: Callable[[T], R], item: T) -> Future:
    # One copied context per task: a Context cannot be entered by two threads at once.
    return pool.submit(contextvars.copy_context().run, fn, item)


def parallel_map(fn: Callable[[T], R], items: list[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``workers`` threads, results in input order (under ``call_slots``, the
    caller lends its slot to the threads it waits for)."""
    if workers <= 1 or len(items) <= 1:
        return [_slotted(fn)(x) for x in items]
    gate = current_gate()
    if gate is not None:
        return _gated_map(gate, fn, items)
    slots = _SLOTS.get()
    with slots.lend() if slots is not None else contextlib.nullcontext(), \
            ThreadPoolExecutor(min(workers, len(items))) as pool:
        return [f.result() for f in [_submit(pool, _slotted(fn), x) for x in items]]


def bounded_unordered(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[tuple[T, R]]:
    """Yield ``(item, fn(item))`` as each finishes, never more than ``workers`` in flight; ``items`` are drawn
    lazily, so a long input is never all queued at once."""
    fn = _slotted(fn)
    if workers <= 1:
        for x in items:
            yield x, fn(x)
        return
    it = iter(items)
    with ThreadPoolExecutor(workers) as pool:
        pending: dict[Future, T] = {_submit(pool, fn, x): x for x in itertools.islice(it, workers)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield pending.pop(f), f.result()
                for nxt in itertools.islice(it, 1):
                    pending[_submit(pool, fn, nxt)] = nxt


_END = object()


class CallSlots:
    """At most ``n`` threads working (``hold``), so at most ``n`` LM calls in flight. A thread waiting for threads
    it started lends its slot meanwhile (``lend``), so nested ``parallel_map`` calls cannot deadlock. A slot waited
    for is time on the item's deadline, so a tight bound can make a slow LM's items abstain sooner.
    """

    def __init__(self, n: int):
        self._free = threading.Semaphore(check_slots(n))
        self._mine = threading.local()  # .held: whether this thread holds a slot

    def _held(self) -> bool:
        return getattr(self._mine, "held", False)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Work in a slot (waiting for one if none is free); nothing to take if this thread holds one already."""
        if self._held():
            yield
            return
        self._free.acquire()
        self._mine.held = True
        try:
            yield
        finally:
            self._mine.held = False
            self._free.release()

    @contextlib.contextmanager
    def lend(self) -> Iterator[None]:
        """Give this thread's slot back while it waits (for threads it started); take one again after."""
        if not self._held():
            yield
            return
        self._mine.held = False
        self._free.release()
        try:
            yield
        finally:
            self._free.acquire()
            self._mine.held = True


def check_slots(n: int | None) -> int | None:
    """``n`` if it can bound LM calls in flight (a whole number >= 1, or None: no bound), else a ``ConfigError``."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        from chateval_dspy.errors import ConfigError

        raise ConfigError(f"max_in_flight: LM calls in flight must be a whole number of 1 or more, got {n!r}")
    return n


_SLOTS: contextvars.ContextVar[CallSlots | None] = contextvars.ContextVar("chateval_call_slots", default=None)


def call_slots(n: int | None) -> contextlib.AbstractContextManager:
    """Within the block (and the threads started in it), at most ``n`` LM calls in flight (``CallSlots``); None: no
    bound beyond the items and referees themselves.

    Example:
        >>> import time
        >>> working, most, guard = [0], [0], threading.Lock()
        >>> def call(_):
        ...     with guard:
        ...         working[0] += 1; most[0] = max(most[0], working[0])
        ...     time.sleep(0.01)
        ...     with guard:
        ...         working[0] -= 1
        >>> def item(_):  # an item: two answer orders, each with three referees speaking at once
        ...     return parallel_map(lambda order: parallel_map(call, [1, 2, 3], 3), [1, 2], 2)
        >>> with call_slots(4):
        ...     _ = list(bounded_unordered(item, range(5), 5))
        >>> most[0] <= 4
        True
    """
    return contextlib.nullcontext() if n is None else set_within(_SLOTS, CallSlots(n))


def _slotted(fn: Callable[[T], R]) -> Callable[[T], R]:
    """``fn`` run in a slot of the ``call_slots`` in force, if any."""
    slots = _SLOTS.get()
    if slots is None:
        return fn

    def run(x: T) -> R:
        with slots.hold():
            return fn(x)

    return run


class Gate:
    """Counts the threads of a run that may still make an LM call, so a batching LM (``lm.batch``) knows when every
    one waits on it: the calls gathered so far then go out as one wave.

    A thread counts from ``add`` (before it runs) until ``done`` or ``park`` (waiting for an answer; ``unpark``
    counts it again before it is woken). A thread waiting in ``parallel_map`` passes its count to its children.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.runnable = 0
        self.parked = 0

    def add(self, n: int) -> None:
        with self._cond:
            self.runnable += n

    def done(self) -> None:
        with self._cond:
            self.runnable -= 1
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

    def wait_quiet(self) -> None:
        """Wait until no thread could still call."""
        with self._cond:
            self._cond.wait_for(lambda: self.runnable <= 0)


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
    """``bounded_unordered`` for a wave run, under a new ``Gate``: ``workers`` threads each judge item after item,
    so a finished item's thread takes the next before the gate could see it idle (its first call joins this wave).
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

    with set_within(_GATE, gate):
        gate.add(workers)
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(worker,), daemon=True,
                                    name=f"chateval-wave-{i}") for i in range(workers)]
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
