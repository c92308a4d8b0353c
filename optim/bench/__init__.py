"""Benchmark suites (agreement, cost, injection) over one shared module (``common``); ``python -m optim.bench``."""
