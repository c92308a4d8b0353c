"""Search: does a K-trial panel search find the strong persona and the oracle's best panel, and what does it overstate?

Trials are drawn over the product's space by the search's own sampler (TPE) or Optuna's random sampler; both are
sequential, so the first K trials of one 40-trial study per seed are a K-trial study. Every panel's expected accuracy
is exact (``theory.panel``), so the oracle, regret and winner's curse need no test-set noise. Figures:
benchmarks/simulation.md.
"""

from __future__ import annotations

import optuna

from chateval_dspy.config import DebateConfig
from chateval_dspy.program.roles import DEFAULT_ORDER
from chateval_dspy.program.strategies import STRATEGIES
from chateval_dspy.testing.sim_lm import SimKnobs
from optim.bench.simulate import theory
from optim.bench.simulate.world import across, judge, make_world, rate
from optim.search.space import SearchSpace, persona_sets, suggest_config
from optim.search.study import make_sampler

STRONG = "scientist"
PANELS = SimKnobs(position_bias=0.1, herding=0.3)
SPACE = SearchSpace(panels=("distinct",), n_roles=(1, len(DEFAULT_ORDER)), turns=(1, 1))
BASE = DebateConfig(turns=1, calibrate=False)
RANDOM_OFFSET = 7919


def every_panel(space: SearchSpace = SPACE) -> list[DebateConfig]:
    """Every panel the space can draw."""
    return [BASE.replace(roles=tuple(roles.split("+")), strategy=strategy, aggregate=aggregate)
            for n in range(space.n_roles[0], space.n_roles[1] + 1) for roles in persona_sets(n)
            for strategy in space.strategies for aggregate in space.aggregates]


def key(cfg: DebateConfig) -> str:
    """What identifies a panel (its changes from the defaults)."""
    return repr(sorted(cfg.changes().items()))


def expected(cfg: DebateConfig, knobs: SimKnobs) -> float:
    """A panel's exact expected accuracy under the model."""
    return theory.panel([knobs.p(r) for r in cfg.roles], knobs, strategy=cfg.strategy, turns=cfg.turns,
                        aggregate=cfg.aggregate)["accuracy"]


def _study(world, sampler: str, trials: int, memo: dict) -> list[tuple[DebateConfig, float]]:
    """``trials`` panels in the order the sampler drew them, each with its dev accuracy."""
    # TPE's first trials are random draws from its own seed: the random sampler gets another, so that the two
    # searches are independent samples rather than the same draws.
    chosen = make_sampler(world.seed) if sampler == "tpe" else optuna.samplers.RandomSampler(seed=world.seed + RANDOM_OFFSET)
    study = optuna.create_study(direction="maximize", sampler=chosen)
    drawn = []
    for _ in range(trials):
        trial = study.ask()
        cfg, _ = suggest_config(trial, SPACE, BASE)
        seen = key(cfg)
        if seen not in memo:
            memo[seen] = judge(world, cfg, world.splits["dev"]).accuracy
        study.tell(trial, memo[seen])
        drawn.append((cfg, memo[seen]))
    return drawn


def run_search(budget, knobs: SimKnobs = PANELS) -> dict:
    """Rows per dev size, sampler and K: strong-persona hit rate, regret, winner's curse, test accuracy."""
    panels = every_panel()
    truth = {key(c): expected(c, knobs) for c in panels}
    oracle = max(panels, key=lambda c: truth[key(c)])
    best = truth[key(oracle)]
    rows = []
    for dev in budget.dev_sizes:
        worlds = [make_world(knobs, seed, {"dev": dev, "test": budget.search_test}) for seed in range(budget.search_seeds)]
        studies = {}
        for sampler in ("tpe", "random"):
            for w in worlds:
                memo = studies.setdefault(("memo", w.seed), {})  # one dev judgement per panel and world
                studies[(sampler, w.seed)] = _study(w, sampler, max(budget.trials), memo)
        tested = {}
        for sampler in ("tpe", "random"):
            for k in budget.trials:
                hit, regret, curse, test = [], [], [], []
                for w in worlds:
                    drawn = studies[(sampler, w.seed)][:k]
                    cfg, dev_score = max(drawn, key=lambda d: d[1])  # the first best, as study.best_trial
                    won = key(cfg)
                    if (w.seed, won) not in tested:
                        tested[(w.seed, won)] = judge(w, cfg, w.splits["test"]).accuracy
                    hit.append(STRONG in cfg.roles)
                    regret.append(best - truth[won])
                    curse.append(dev_score - truth[won])
                    test.append(tested[(w.seed, won)])
                rows.append({"dev": dev, "sampler": sampler, "trials": k, "strong_on_winner": rate(hit),
                             "regret": across(regret), "winners_curse": across(curse), "test_accuracy": across(test)})
    share = sum(STRONG in c.roles for c in panels) / len(panels)
    return {"knobs": knobs, "space": SPACE.to_dict(), "panels": len(panels), "test": budget.search_test,
            "oracle": {"config": oracle.changes(), "accuracy": best},
            "strong_share_of_space": share, "strategies": list(STRATEGIES), "rows": rows}
