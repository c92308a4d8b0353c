"""``python -m optim.bench simulate``: do tuning and search recover signal that is planted with a known size?

The referees are simulated (``chateval_dspy.testing.sim_lm`` states the model); the program, optimizers and search
are the product's own. One section per module (``aggregation``, ``calibration``, ``compiling``, ``search``, and
``labels`` from ``compiling``); every figure is a mean over seeds with its 95% interval, beside the value the model
predicts where one is derivable (``theory``). Method and figures: benchmarks/simulation.md.

    python -m optim.bench simulate --smoke          # every section on a small budget (CI)
    python -m optim.bench simulate --markdown       # the full study
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from chateval_dspy.testing.sim_lm import SimKnobs

SECTIONS = ("aggregation", "calibration", "compile", "search", "labels")
OPTIMIZERS = ("labeled", "bootstrap", "bootstrap_rs", "mipro", "gepa")


@dataclass(frozen=True)
class Budget:
    """How much each section judges: seeds and items per world (aggregation, calibration, compile), panel sizes
    (aggregation, calibration), training labels, dev and test items per optimizer (compile, labels), and search
    budgets K, dev sizes, worlds and test items (search)."""

    seeds: int = 8
    items: int = 150
    panel_sizes: tuple[int, ...] = (1, 2, 3, 4, 5, 7, 9)
    herd_sizes: tuple[int, ...] = (1, 3, 5)
    calibration_sizes: tuple[int, ...] = (1, 3, 5)
    train_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    dev: int = 20
    test: int = 200
    optimizers: tuple[str, ...] = OPTIMIZERS
    max_demos: int = 4
    candidates: int = 4
    trials: tuple[int, ...] = (5, 10, 20, 40)
    dev_sizes: tuple[int, ...] = (10, 50)
    search_seeds: int = 20
    search_test: int = 100


SMOKE = Budget(seeds=2, items=24, panel_sizes=(1, 3), herd_sizes=(3,), calibration_sizes=(1,), train_sizes=(2, 4),
               dev=6, test=24, trials=(5, 10), dev_sizes=(6,), search_seeds=2, search_test=24)


def budget_from(smoke: bool, seeds: int | None = None) -> Budget:
    """The smoke or full budget, with ``seeds`` (if given) for every section."""
    base = SMOKE if smoke else Budget()
    return base if seeds is None else replace(base, seeds=seeds, search_seeds=seeds)


def _knobs(value):
    if isinstance(value, SimKnobs):
        return asdict(value)
    if isinstance(value, dict):
        return {k: _knobs(v) for k, v in value.items()}
    return value


def run_sections(budget: Budget, sections=SECTIONS, *, no_signal: bool = False,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Run the chosen sections; each result carries its knobs, sizes and wall seconds.

    ``labels`` reads ``compile`` (run for it if not chosen); ``no_signal`` sets every section's knobs to
    ``SimKnobs.no_signal()`` (the study must then find nothing); ``progress`` gets a line after each section.
    """
    from optim.bench.simulate import aggregation, calibration, compiling, search

    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; choose from: {', '.join(SECTIONS)}")
    flat = SimKnobs.no_signal()
    out: dict = {}
    for name in sections:
        start = time.perf_counter()
        # The optimizers print progress (and tqdm bars) of their own; the study's output is its tables.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), _quiet():
            if name == "aggregation":
                out[name] = aggregation.run_aggregation(budget)
            elif name == "calibration":
                out[name] = calibration.run_calibration(budget)
            elif name == "compile" or (name == "labels" and "compile" not in out):
                out["compile"] = compiling.run_compile(budget, flat if no_signal else compiling.TUNABLE)
            elif name == "search":
                out[name] = search.run_search(budget, flat if no_signal else search.PANELS)
            if name == "labels":
                out[name] = {"rows": compiling.labels_needed(out["compile"])}
        out[name]["seconds"] = time.perf_counter() - start
        if progress:
            progress(f"{name}: {out[name]['seconds']:.0f} s")
    return _knobs(out)


@contextlib.contextmanager
def _quiet():
    import optuna

    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    levels = {lg: lg.level for lg in map(logging.getLogger, ("dspy", "optuna", "chateval_dspy"))}
    for lg in levels:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(previous)
        for lg, level in levels.items():
            lg.setLevel(level)
