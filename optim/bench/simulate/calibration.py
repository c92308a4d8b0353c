"""Calibration: a position-biased panel with and without answer-order calibration.

Independent referees of accuracy ``p`` say "answer 1" with probability ``position_bias`` whatever the item;
calibrated, each also judges the swapped order and the orders' verdicts are pooled (an item is consistent when both
orders' panel verdicts agree). ``theory.panel`` gives both figures exactly.
"""

from __future__ import annotations

import itertools

from chateval_dspy.config import DebateConfig
from chateval_dspy.testing.sim_lm import SimKnobs
from optim.bench.simulate import theory
from optim.bench.simulate.world import across, independent_roles, judge, make_world

BIASED = SimKnobs(default_accuracy=0.7, position_bias=0.3)


def run_calibration(budget) -> dict:
    """Rows ``{n, aggregate, calibrate, accuracy, consistency, first_rate, theory_*}`` over seeds."""
    roles = independent_roles(max(budget.calibration_sizes))
    worlds = [make_world(BIASED, seed, {"test": budget.items}, roles=roles) for seed in range(budget.seeds)]
    rows = []
    for n, aggregate, calibrate in itertools.product(budget.calibration_sizes, ("majority", "mean"), (False, True)):
        cfg = DebateConfig(roles=tuple(r.slug for r in roles[:n]), turns=1, strategy="simultaneous_talk",
                           aggregate=aggregate, calibrate=calibrate)
        judged = [judge(w, cfg, w.splits["test"]) for w in worlds]
        exact = theory.panel([BIASED.default_accuracy] * n, BIASED, aggregate=aggregate, calibrate=calibrate)
        rows.append({"n": n, "aggregate": aggregate, "calibrate": calibrate,
                     "accuracy": across([j.accuracy for j in judged]),
                     "consistency": across([j.consistency for j in judged]) if calibrate else None,
                     "first_rate": across([j.first_rate for j in judged]),
                     "theory_accuracy": exact["accuracy"], "theory_consistency": exact["consistency"]})
    return {"knobs": BIASED, "items": budget.items, "rows": rows}
