"""Aggregation: panel accuracy against the number of referees, independent (Condorcet) and herding, per strategy.

Independent referees of equal accuracy ``p`` speak once under ``simultaneous_talk`` (nobody sees
anybody), so a strict majority is right with Condorcet's binomial probability; ``mean`` weighs each
verdict by its score margin. With herding on, two rounds let talk turns be seen under each strategy's
visibility rule, and the exact value comes from ``theory.panel``.
"""

from __future__ import annotations

from chateval_dspy.config import DebateConfig
from chateval_dspy.program.strategies import STRATEGIES
from chateval_dspy.testing.sim_lm import SimKnobs
from optim.bench.simulate import theory
from optim.bench.simulate.world import across, independent_roles, judge, make_world

INDEPENDENT = SimKnobs(default_accuracy=0.65)
HERDING = SimKnobs(default_accuracy=0.65, herding=0.5)


def run_aggregation(budget) -> dict:
    """Rows ``{kind, n, strategy, aggregate, accuracy (over seeds), theory}`` for both panels' families."""
    rows = []
    roles = independent_roles(max(budget.panel_sizes + budget.herd_sizes))
    cells = [("independent", n, "simultaneous_talk", 1, aggregate, INDEPENDENT)
             for n in budget.panel_sizes for aggregate in ("majority", "mean")]
    cells += [("herding", n, strategy, 2, "majority", HERDING) for strategy in STRATEGIES for n in budget.herd_sizes]
    worlds = {s: {} for s in range(budget.seeds)}
    for kind, n, strategy, turns, aggregate, knobs in cells:
        cfg = DebateConfig(roles=tuple(r.slug for r in roles[:n]), turns=turns, strategy=strategy,
                           aggregate=aggregate, calibrate=False)
        accs = []
        for seed in range(budget.seeds):
            world = worlds[seed].get(kind) or make_world(knobs, seed, {"test": budget.items}, roles=roles)
            worlds[seed][kind] = world
            accs.append(judge(world, cfg, world.splits["test"]).accuracy)
        ps = [knobs.default_accuracy] * n
        exact = theory.panel(ps, knobs, strategy=strategy, turns=turns, aggregate=aggregate)["accuracy"]
        rows.append({"kind": kind, "n": n, "strategy": strategy, "turns": turns, "aggregate": aggregate,
                     "accuracy": across(accs), "theory": exact,
                     "condorcet": theory.condorcet(knobs.default_accuracy, n) if aggregate == "majority" else None})
    return {"knobs": {"independent": INDEPENDENT, "herding": HERDING}, "items": budget.items, "rows": rows}
