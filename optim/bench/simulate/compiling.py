"""Compile: test agreement before and after each optimizer as the number of training labels grows.

One General Public referee judges; demos and keyed instructions raise its accuracy, so the planted ceiling is
``knobs.p("general_public", right_demos=max_demos, keyed=True)``. Optimizers run as ``chateval compile`` runs them
(``compile_evaluator``); the gain is paired by seed. Method: benchmarks/simulation.md.
"""

from __future__ import annotations

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.sim_lm import SimKnobs
from optim.bench.simulate.world import across, judge, make_world
from optim.tuning.compile import OptimizerSettings, compile_evaluator
from optim.tuning.objectives import agreement

TUNABLE = SimKnobs()
REFEREE = "general_public"
CONFIG = DebateConfig(roles=(REFEREE,), turns=1, calibrate=False, aggregate="majority")


def compile_once(world, optimizer: str, n_train: int, budget) -> dict:
    """Compile on the first ``n_train`` train items; its test accuracy and what the judge learnt."""
    settings = OptimizerSettings(max_demos=budget.max_demos, candidates=budget.candidates, auto="light",
                                 seed=world.seed)
    with dspy.context(lm=world.lm, adapter=DebateAdapter(), disable_history=True):
        program = compile_evaluator(build_evaluator(CONFIG), optimizer=optimizer,
                                    trainset=world.splits["train"][:n_train], valset=world.splits["dev"],
                                    metric=agreement, settings=settings, reflection_lm=world.lm)
    judge_predictor = program.debate.referees[REFEREE].judge
    keyed = world.knobs.instruction_key.lower() in judge_predictor.signature.instructions.lower()
    return {"accuracy": judge(world, CONFIG, world.splits["test"], program).accuracy,
            "demos": len(judge_predictor.demos), "keyed": keyed}


def run_compile(budget, knobs: SimKnobs = TUNABLE) -> dict:
    """Rows ``{optimizer, n_train, before, after, gain, demos, keyed}`` over seeds, with the planted values."""
    sizes = {"train": max(budget.train_sizes), "dev": budget.dev, "test": budget.test}
    worlds = [make_world(knobs, seed, sizes) for seed in range(budget.seeds)]
    before = [judge(w, CONFIG, w.splits["test"]).accuracy for w in worlds]
    rows = []
    for optimizer in budget.optimizers:
        for n_train in budget.train_sizes:
            runs = [compile_once(w, optimizer, n_train, budget) for w in worlds]
            rows.append({"optimizer": optimizer, "n_train": n_train, "before": across(before),
                         "after": across([r["accuracy"] for r in runs]),
                         "gain": across([r["accuracy"] - b for r, b in zip(runs, before)]),
                         "demos": across([r["demos"] for r in runs]),
                         "keyed": across([float(r["keyed"]) for r in runs])})
    return {"knobs": knobs, "config": CONFIG.changes(), "max_demos": budget.max_demos, "dev": budget.dev,
            "test": budget.test,
            "planted": {"untuned": knobs.p(REFEREE), "demos": knobs.p(REFEREE, right_demos=budget.max_demos),
                        "instructions": knobs.p(REFEREE, keyed=True),
                        "ceiling": knobs.p(REFEREE, right_demos=budget.max_demos, keyed=True)}, "rows": rows}


def labels_needed(compiled: dict) -> list[dict]:
    """Per optimizer, the fewest training labels whose mean gain has a 95% CI above 0 (None: none of those tried)."""
    out = []
    for optimizer in dict.fromkeys(r["optimizer"] for r in compiled["rows"]):
        rows = sorted((r for r in compiled["rows"] if r["optimizer"] == optimizer), key=lambda r: r["n_train"])
        first = next((r for r in rows if r["gain"]["ci_low"] is not None and r["gain"]["ci_low"] > 0), None)
        out.append({"optimizer": optimizer, "labels_needed": first["n_train"] if first else None,
                    "gain_there": first["gain"] if first else None, "tried": [r["n_train"] for r in rows],
                    "largest_gain": max((r["gain"] for r in rows), key=lambda g: g["value"] or 0)})
    return out
