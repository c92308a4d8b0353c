"""Optuna over panel shapes: ``chateval search`` as a function (``run``), one idea per module."""
