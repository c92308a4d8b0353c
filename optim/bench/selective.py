"""Does the selective-verdict guarantee hold? Threshold choice (``optim.tuning.selective``) over many calibration draws.

Items and votes follow the simulated referees' model with item difficulty, drawn directly with numpy (what is
measured is the threshold procedure, not the DSPy program, and hundreds of draws take seconds). "Held" is counted on
the use mix exactly and on ``--fresh`` drawn items; a draw reaching no threshold holds vacuously. Method and figures:
benchmarks/selective.md.

    python -m optim.bench selective --draws 200 --level 0.8 --risk 0.1
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from chateval_dspy.testing.sim_lm import SimKnobs
from optim.bench.stats import proportion
from optim.tuning.confidence import expected_calibration_error, fit_confidence_map
from optim.tuning.selective import choose_threshold

D_GRID = 2000  # midpoints over [0, spread] for the exact population rates


def add_parser(sub) -> None:
    se = sub.add_parser("selective", help="selective verdicts: does the agreement guarantee hold over calibration "
                                          "draws (simulated referees with item difficulty; no LM)")
    se.add_argument("--draws", type=int, default=200, help="calibration draws per row (default 200)")
    se.add_argument("--calibration", type=int, default=500, help="labelled calibration items per draw (default 500)")
    se.add_argument("--fresh", type=int, default=2000, help="fresh items per draw for the realized rate (default 2000)")
    se.add_argument("--level", type=float, default=0.8, help="agreement asked for (default 0.8)")
    se.add_argument("--risk", type=float, default=0.1, help="accepted chance that the guarantee fails (default 0.1)")
    se.add_argument("--hard", type=float, default=1.0, help="difficulty spread of the use mix (default 1.0)")
    se.add_argument("--easy", type=float, default=0.4, help="difficulty spread the control calibrates on (default 0.4)")
    se.add_argument("--seed", type=int, default=0)


class VoteStage:
    """A judge's votes: referee groups ``(accuracy, votes)``, its weighted vote, confidence and exact outcome rates."""

    def __init__(self, groups: list[tuple[float, int]]):
        self.ps = np.asarray([p for p, _ in groups], dtype=float)
        self.counts = np.asarray([c for _, c in groups])
        self.weights = np.log(self.ps / (1 - self.ps))
        self.outcomes = np.asarray(list(itertools.product(*(range(c + 1) for c in self.counts))))

    def score(self, right: np.ndarray) -> np.ndarray:
        """Signed weighted vote towards the right answer, from right votes per group (items x groups)."""
        return ((2 * right - self.counts) * self.weights).sum(axis=-1)

    def p_item(self, d: np.ndarray) -> np.ndarray:
        return 0.5 + (self.ps[None, :] - 0.5) * (1 - d[:, None])

    def draw(self, rng: np.random.Generator, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each item's (raw confidence, agreed with people) given its difficulty."""
        s = self.score(rng.binomial(self.counts[None, :], self.p_item(d)))
        return confidence(s), s > 0

    def outcome_rates(self, d: np.ndarray) -> np.ndarray:
        """P(outcome | d), outcomes x d (every combination of right votes per group)."""
        from scipy.stats import binom

        p = self.p_item(d)
        out = np.ones((len(self.outcomes), d.size))
        for g in range(len(self.counts)):
            out *= binom.pmf(self.outcomes[:, g][:, None], self.counts[g], p[:, g][None, :])
        return out


def confidence(score: np.ndarray) -> np.ndarray:
    """A judge's raw confidence: the posterior of its verdict assuming ``d = 0``."""
    return 1.0 / (1.0 + np.exp(-np.abs(score)))


def panel_groups(knobs: SimKnobs) -> list[tuple[float, int]]:
    """The built-in roles grouped by accuracy, each judging both answer orders: ``(accuracy, votes)``."""
    return [(q, 2 * sum(1 for _, p in knobs.accuracy if p == q)) for q in sorted({p for _, p in knobs.accuracy})]


def grid(spread: float) -> np.ndarray:
    """Midpoints over ``[0, spread]``: the difficulties the exact population rates integrate over."""
    return (np.arange(D_GRID) + 0.5) / D_GRID * spread


def population(panel: VoteStage, spread: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every distinct vote outcome: its confidence, whether it agrees, and its probability under the mix."""
    s = panel.score(panel.outcomes)
    return confidence(s), s > 0, panel.outcome_rates(grid(spread)).mean(axis=-1)


def population_rates(pop: tuple, threshold: float) -> tuple[float, float]:
    """(coverage, agreement of the verdicts given) on unlimited fresh items at ``threshold``."""
    conf, agrees, prob = pop
    given = conf >= threshold
    covered = prob[given].sum()
    return float(covered), float(prob[given & agrees].sum() / covered) if covered else math.nan


def run_row(panel: VoteStage, args, *, calibrate_on: float, use_on: float, rng: np.random.Generator) -> dict:
    """One row: ``args.draws`` calibration draws and how often the guarantee held on the use mix."""
    pop = population(panel, use_on)
    held = held_fresh = reached = held_reached = 0
    coverages, agreements, ece_raw, ece_mapped = [], [], [], []
    for _ in range(args.draws):
        conf, agreed = panel.draw(rng, calibrate_on * rng.random(args.calibration))
        selection = choose_threshold(conf.tolist(), agreed.tolist(), level=args.level, risk=args.risk)
        fresh_conf, fresh_agreed = panel.draw(rng, use_on * rng.random(args.fresh))
        cmap = fit_confidence_map(conf, agreed)
        ece_raw.append(expected_calibration_error(fresh_conf, fresh_agreed))
        ece_mapped.append(expected_calibration_error(np.interp(fresh_conf, cmap.raw, cmap.calibrated), fresh_agreed))
        if not selection.reached:
            held += 1
            held_fresh += 1
            continue
        reached += 1
        coverage, agreement = population_rates(pop, selection.threshold)
        given = fresh_conf >= selection.threshold
        held += agreement >= args.level
        held_reached += agreement >= args.level
        held_fresh += (not given.any()) or fresh_agreed[given].mean() >= args.level
        coverages.append(coverage)
        agreements.append(agreement)
    return {"calibrate_spread": calibrate_on, "use_spread": use_on, "draws": args.draws,
            "held": proportion(held, args.draws), "held_fresh": proportion(held_fresh, args.draws),
            "reached": proportion(reached, args.draws), "held_when_reached": proportion(held_reached, reached),
            "coverage": over_draws(coverages),
            "agreement": over_draws(agreements), "oracle": oracle(pop, args.level),
            "ece_raw": over_draws(ece_raw), "ece_calibrated": over_draws(ece_mapped)}


def over_draws(values: list[float]) -> dict:
    """Mean over draws with the 2.5th and 97.5th percentiles (the draw-to-draw spread, not a CI of the mean)."""
    if not values:
        return {"value": math.nan, "p2_5": math.nan, "p97_5": math.nan, "n": 0}
    a = np.asarray(values)
    return {"value": float(a.mean()), "p2_5": float(np.percentile(a, 2.5)), "p97_5": float(np.percentile(a, 97.5)),
            "n": int(a.size)}


def oracle(pop: tuple, level: float) -> dict:
    """The lowest threshold whose population agreement reaches ``level`` (what unlimited labels would choose)."""
    best = None
    for t in sorted(set(pop[0].tolist()), reverse=True):
        coverage, agreement = population_rates(pop, t)
        if agreement >= level:
            best = {"threshold": t, "coverage": coverage, "agreement": agreement}
    return best or {"threshold": None, "coverage": 0.0, "agreement": math.nan}


def run_selective(args) -> int:
    """Both rows, printed with their intervals."""
    if args.draws < 1 or args.calibration < 1 or args.fresh < 1:
        print("bench: error: --draws, --calibration and --fresh must be positive")
        return 2
    panel, rng = VoteStage(panel_groups(SimKnobs())), np.random.default_rng(args.seed)
    rows = {"exchangeable": run_row(panel, args, calibrate_on=args.hard, use_on=args.hard, rng=rng),
            "control": run_row(panel, args, calibrate_on=args.easy, use_on=args.hard, rng=rng)}
    print(render(rows, args))
    return 0


def rate_text(d: dict) -> str:
    return f"{d['value']:.1%} [{d['ci_low']:.1%}, {d['ci_high']:.1%}]"


def render(rows: dict, args) -> str:
    lines = [f"Selective verdicts: simulated referees (5 built-in roles, untuned, both orders, no herding/bias), "
             f"level {args.level}, risk {args.risk}, {args.calibration} calibration items per draw, {args.draws} draws "
             f"per row, seed {args.seed}; exact 95% CIs over draws; coverage/agreement: mean [2.5-97.5 pct] over "
             f"draws that reached a threshold, on unlimited fresh items.",
             f"{'row':13s} {'calibrate/use spread':21s} {'held (population)':24s} {'held (' + str(args.fresh) + ' fresh)':24s} "
             f"{'threshold reached':24s} {'held when reached':24s} {'coverage':24s} {'agreement':24s} oracle coverage"]
    for name, r in rows.items():
        cov, agr, orc = r["coverage"], r["agreement"], r["oracle"]
        lines.append(f"{name:13s} {r['calibrate_spread']:.2f} / {r['use_spread']:.2f}{'':9s} {rate_text(r['held']):24s} "
                     f"{rate_text(r['held_fresh']):24s} {rate_text(r['reached']):24s} {rate_text(r['held_when_reached']):24s} "
                     f"{cov['value']:.1%} [{cov['p2_5']:.1%}, {cov['p97_5']:.1%}]{'':3s} "
                     f"{agr['value']:.1%} [{agr['p2_5']:.1%}, {agr['p97_5']:.1%}]{'':3s} {orc['coverage']:.1%}")
    for name, r in rows.items():
        raw, mapped = r["ece_raw"], r["ece_calibrated"]
        lines.append(f"{name}: ECE on {args.fresh} fresh items per draw (10 bins; mean [2.5-97.5 pct] over "
                     f"{args.draws} draws): raw confidence {raw['value']:.3f} [{raw['p2_5']:.3f}, {raw['p97_5']:.3f}], "
                     f"isotonic map fitted on the {args.calibration} calibration items {mapped['value']:.3f} "
                     f"[{mapped['p2_5']:.3f}, {mapped['p97_5']:.3f}]")
    target = 1 - args.risk
    ex = rows["exchangeable"]["held"]
    lines.append(f"target: the guarantee holds in >= {target:.0%} of exchangeable draws: "
                 f"{'met' if ex['value'] >= target else 'NOT met'} ({ex['value']:.1%}); control (calibrated on spread "
                 f"{args.easy}, used on {args.hard}): held in {rows['control']['held']['value']:.1%} of draws, a failure "
                 f"of exchangeability, not of the procedure.")
    return "\n".join(lines)
