"""Does the selective-verdict guarantee hold? Threshold choice (``optim.tuning.selective``) over many calibration draws.

The items and verdicts follow the simulated referees' generative model (``chateval_dspy.testing.sim_lm``, its
docstring holds the equations) with item difficulty, drawn directly from the model with numpy rather than
by running the DSPy program (what is measured is the threshold procedure, not the program, and this keeps
hundreds of draws to seconds). The panel is the five built-in roles at their untuned accuracies
(``SimKnobs().accuracy``), each judging both answer orders independently, with no herding and no position
bias: 10 votes per item. Each item has difficulty ``d = spread * u``; each vote is right with
``SimKnobs.harder(p, d)``. The verdict is the weighted vote (weights ``log(p / (1 - p))``, a tie is a verdict
that disagrees with people) and its confidence is that vote's naive-Bayes posterior assuming ``d = 0``: an
uncalibrated score whose order is all the threshold procedure uses.

Per draw: ``--calibration`` items from the calibration mix choose a threshold at ``--level`` and ``--risk``;
the guarantee held if the agreement of the verdicts given on fresh items from the use mix is at least the
level. "Fresh items" are counted two ways: exactly, as the model's population rate at that threshold
(computed by summing over every vote count and integrating over ``d``), which is what the guarantee is
about; and as realized on ``--fresh`` items drawn per draw (noisier, so it holds less often). A draw
whose threshold is unreachable gives no verdict and so holds vacuously; those are counted apart. Each draw
also fits the isotonic confidence map (``optim.tuning.confidence.fit_confidence_map``) on its calibration
items and measures the expected calibration error (10 bins) on its fresh items, of the raw confidence and of
the mapped one.

Rows: ``exchangeable`` (calibrate and use on the same mix, spread ``--hard``) must hold in at least
``1 - risk`` of the draws. ``control`` calibrates on an easy mix (spread ``--easy``) and judges the hard mix,
which breaks exchangeability: the guarantee is not promised there, and the row shows how it fails.

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


class Panel:
    """The simulated panel's votes, confidences and exact population rates (referees grouped by accuracy)."""

    def __init__(self, knobs: SimKnobs, orders: int = 2):
        ps = sorted({p for _, p in knobs.accuracy})
        counts = [sum(1 for _, p in knobs.accuracy if p == q) * orders for q in ps]
        self.ps, self.counts = np.asarray(ps), np.asarray(counts)
        self.weights = np.log(self.ps / (1 - self.ps))

    def score(self, right: np.ndarray) -> np.ndarray:
        """Signed weighted vote towards the right answer, from right votes per group (items x groups)."""
        return ((2 * right - self.counts) * self.weights).sum(axis=-1)

    def confidence(self, score: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.abs(score)))

    def draw(self, rng: np.random.Generator, n: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
        """``n`` items: each verdict's confidence and whether it agrees with people."""
        d = spread * rng.random(n)
        p_item = np.where(d[:, None] > 0, 0.5 + (self.ps[None, :] - 0.5) * (1 - d[:, None]), self.ps[None, :])
        right = rng.binomial(self.counts[None, :], p_item)
        s = self.score(right)
        return self.confidence(s), s > 0

    def population(self, spread: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every distinct vote outcome: its confidence, whether it agrees, and its probability under the mix."""
        d = (np.arange(D_GRID) + 0.5) / D_GRID * spread
        from scipy.stats import binom

        outcomes = list(itertools.product(*(range(c + 1) for c in self.counts)))
        prob = np.zeros(len(outcomes))
        for j, votes in enumerate(outcomes):
            per_d = np.ones_like(d)
            for g, v in enumerate(votes):
                per_d *= binom.pmf(v, self.counts[g], 0.5 + (self.ps[g] - 0.5) * (1 - d))
            prob[j] = per_d.mean()
        s = self.score(np.asarray(outcomes))
        return self.confidence(s), s > 0, prob


def population_rates(pop: tuple, threshold: float) -> tuple[float, float]:
    """(coverage, agreement of the verdicts given) on unlimited fresh items at ``threshold``."""
    conf, agrees, prob = pop
    given = conf >= threshold
    covered = prob[given].sum()
    return float(covered), float(prob[given & agrees].sum() / covered) if covered else math.nan


def run_row(panel: Panel, args, *, calibrate_on: float, use_on: float, rng: np.random.Generator) -> dict:
    """One row: ``args.draws`` calibration draws and how often the guarantee held on the use mix."""
    pop = panel.population(use_on)
    held = held_fresh = reached = held_reached = 0
    coverages, agreements, ece_raw, ece_mapped = [], [], [], []
    for _ in range(args.draws):
        conf, agreed = panel.draw(rng, args.calibration, calibrate_on)
        selection = choose_threshold(conf.tolist(), agreed.tolist(), level=args.level, risk=args.risk)
        fresh_conf, fresh_agreed = panel.draw(rng, args.fresh, use_on)
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
    panel, rng = Panel(SimKnobs()), np.random.default_rng(args.seed)
    rows = {"exchangeable": run_row(panel, args, calibrate_on=args.hard, use_on=args.hard, rng=rng),
            "control": run_row(panel, args, calibrate_on=args.easy, use_on=args.hard, rng=rng)}
    print(render(rows, args))
    return 0


def _rate(d: dict) -> str:
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
        lines.append(f"{name:13s} {r['calibrate_spread']:.2f} / {r['use_spread']:.2f}{'':9s} {_rate(r['held']):24s} "
                     f"{_rate(r['held_fresh']):24s} {_rate(r['reached']):24s} {_rate(r['held_when_reached']):24s} "
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
