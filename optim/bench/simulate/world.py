"""One simulated world per seed: labelled synthetic items, the simulated referees' LM, and how a panel is judged.

Every section draws its worlds here, so a figure's CI over seeds covers both the items and the
referees' draws. Panels run through the product's own ``build_evaluator`` and ``evaluate`` under
the CLI's adapter; only the LM is simulated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import dspy
from scipy import stats

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import Role
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.testing.sim_lm import SimKnobs, builtin_personas, sim_lm, synthetic_items


@dataclass
class World:
    """One seed's items by split and the LM of referees who know their labels."""

    seed: int
    knobs: SimKnobs
    splits: dict[str, list[dspy.Example]]
    lm: dspy.LM  # run with disable_history: DSPy would keep each LM's last 10,000 calls in memory
    roles: list[Role] | None = None  # custom referees (the independent panels); None: the built-in personas


def independent_roles(n: int) -> list[Role]:
    """``n`` referees with distinct persona texts that no accuracy is listed for (``default_accuracy``)."""
    return [Role(f"sim_{i}", f"Referee {i}", (("*", f"You are referee number {i} of an independent panel."),))
            for i in range(1, n + 1)]


def make_world(knobs: SimKnobs, seed: int, sizes: dict[str, int], *, roles: list[Role] | None = None) -> World:
    """Items per split name (texts unique to the seed and split) and an LM seeded by ``seed`` (replacing ``knobs``'s);
    custom ``roles`` are known to the LM by persona and get ``default_accuracy``."""
    knobs = knobs.replace(seed=seed)
    splits = {name: synthetic_items(n, seed=seed, prefix=name) for name, n in sizes.items()}
    personas = builtin_personas()
    for role in roles or ():
        personas.setdefault(role.persona("pairwise"), role.slug)
    lm = sim_lm(knobs, [x for items in splits.values() for x in items], personas)
    return World(seed, knobs, splits, lm, roles)


@dataclass(frozen=True)
class Judged:
    """A panel's verdicts on some items."""

    accuracy: float
    consistency: float | None  # both answer orders agreed (calibrated panels only)
    first_rate: float  # share of verdicts for the answer shown first
    calls: int
    correct: tuple[bool, ...]


def judge(world: World, config: DebateConfig, items: Sequence[dspy.Example], program: dspy.Module | None = None) -> Judged:
    """Judge ``items`` with ``program`` (default: ``build_evaluator(config)`` over the world's roles)."""
    roles = None
    if world.roles is not None:
        by_slug = {r.slug: r for r in world.roles}
        roles = [by_slug[s] for s in config.roles]
    program = program or build_evaluator(config, roles)
    with dspy.context(lm=world.lm, adapter=DebateAdapter(), disable_history=True):
        result = evaluate(program, items, config)
    correct = tuple(h == p for h, p in zip(result.human, result.predicted))
    consistency = statistics.fmean(result.consistent) if result.consistent else None
    return Judged(statistics.fmean(correct), consistency, statistics.fmean(p == "1" for p in result.predicted),
                  result.calls, correct)


def across(values: Sequence[float | None]) -> dict:
    """Mean over seeds with its 95% t-interval (no CI from fewer than two seeds).

    Example:
        >>> across([0.5, 0.7])["value"]
        0.6
    """
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return {"value": None, "ci_low": None, "ci_high": None, "n": 0}
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return {"value": mean, "ci_low": None, "ci_high": None, "n": len(xs)}
    half = float(stats.t.ppf(0.975, len(xs) - 1)) * statistics.stdev(xs) / math.sqrt(len(xs))
    return {"value": mean, "ci_low": mean - half, "ci_high": mean + half, "n": len(xs)}


def rate(hits: Sequence[bool]) -> dict:
    """A share over seeds with its exact (Clopper-Pearson) 95% interval."""
    from optim.bench.stats import proportion

    return proportion(sum(bool(h) for h in hits), len(hits))
