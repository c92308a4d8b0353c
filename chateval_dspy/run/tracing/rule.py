"""When to trace (``tracing_default``): by default only as many debates as a person will actually read, and never
unasked on a server (``chateval serve``), which judges an unbounded number of items. MLflow is the target of
``chateval evaluate`` unless ``--no-mlflow``, and of ``chateval score`` when ``--tracking-uri`` or
``$MLFLOW_TRACKING_URI`` names a store.
"""

from __future__ import annotations

import itertools
from pathlib import Path

# Tracing is on by default for runs of at most this many items (and MLflow as the tracking target).
DEFAULT_MAX_ITEMS = 100
TRACE_HELP = (f"log each judged item as an MLflow trace (orders, rounds, referee turns). Default: on when MLflow "
              f"is the tracking target and the run judges at most {DEFAULT_MAX_ITEMS} items")


def tracing_default(flag: bool | None, *, mlflow_target: bool, items: int | None) -> bool:
    """Whether to trace: the flag (``--trace``/``--no-trace``) when given; else on when MLflow is the tracking target
    and the run judges a known number of items, at most ``DEFAULT_MAX_ITEMS`` (``items=None``: unbounded, a server).

    Example:
        >>> tracing_default(None, mlflow_target=True, items=20), tracing_default(None, mlflow_target=True, items=500)
        (True, False)
        >>> tracing_default(None, mlflow_target=False, items=5), tracing_default(True, mlflow_target=False, items=None)
        (False, True)
    """
    if flag is not None:
        return bool(flag)
    return mlflow_target and items is not None and items <= DEFAULT_MAX_ITEMS


def at_most_lines(path: str | Path, n: int) -> bool:
    """Whether the file has at most ``n`` non-blank lines, reading no further than line ``n + 1``
    (a cheap upper bound on its rows, for the default rule)."""
    with open(path, "rb") as f:
        return next(itertools.islice((line for line in f if line.strip()), n, None), None) is None
