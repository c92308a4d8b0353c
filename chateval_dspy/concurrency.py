"""Threads that keep DSPy's settings: the LM, adapter and usage tracker live in contextvars."""

from __future__ import annotations

import contextvars
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
