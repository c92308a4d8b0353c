"""Does a two-stage cascade (a cheap single judge, then a strong panel) keep its guarantee, and what does it save?

Items and votes are drawn as in ``optim.bench.selective``; ``--evidence tokens`` models token probabilities as a
Thurstonian judge (an assumption, stated as such). Method, cost units and figures: benchmarks/selective.md.

    python -m optim.bench cascade --draws 200
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np

from chateval_dspy.testing.sim_lm import SimKnobs
from optim.bench.selective import VoteStage, confidence, grid, over_draws, panel_groups, rate_text
from optim.bench.stats import proportion
from optim.tuning.confidence import expected_calibration_error, fit_confidence_map
from optim.tuning.selective import choose_cascade_thresholds

PANEL_COST = 4.0  # default panel's 8 LM calls per item / the single judge's 2 (both answer orders)


def add_parser(sub) -> None:
    ca = sub.add_parser("cascade", help="a cheap judge then a strong panel: does the cascade's guarantee hold over "
                                        "calibration draws, and its cost against the panel on every item (no LM)")
    ca.add_argument("--draws", type=int, default=200, help="calibration draws per row (default 200)")
    ca.add_argument("--calibration", type=int, default=1000, help="labelled calibration items per draw (default 1000)")
    ca.add_argument("--fresh", type=int, default=2000, help="fresh items per draw for the realized rate (default 2000)")
    ca.add_argument("--level", type=float, help="agreement asked for (default: the panel's on every item of the use mix)")
    ca.add_argument("--risk", type=float, default=0.1, help="accepted chance that the guarantee fails (default 0.1)")
    ca.add_argument("--cheap-accuracies", default="0.7,0.8,0.9", help="the cheap judge's accuracy, one row pair each")
    ca.add_argument("--evidence", default="votes,tokens",
                    help="what each call gives: votes, tokens (votes with token probabilities), or both (default)")
    ca.add_argument("--panel-cost", type=float, default=PANEL_COST,
                    help=f"the panel's cost per item in cheap-judge units (default {PANEL_COST:g}: 8 calls / 2)")
    ca.add_argument("--hard", type=float, default=1.0, help="difficulty spread of the use mix (default 1.0)")
    ca.add_argument("--easy", type=float, default=0.4, help="difficulty spread the control calibrates on (default 0.4)")
    ca.add_argument("--seed", type=int, default=0)
    ca.add_argument("--out", help="also write the rows as JSON here")


class TokenStage(VoteStage):
    """The same referees with token probabilities: the stage's summed log-likelihood ratio is normal given ``d``."""

    def __init__(self, groups: list[tuple[float, int]]):
        from scipy.stats import norm

        super().__init__(groups)
        self.weights = 2 * norm.ppf(self.ps)  # log-likelihood ratio per unit of latent score, at d = 0

    def moments(self, d: np.ndarray) -> tuple[np.ndarray, float]:
        """Mean (per ``d``) and standard deviation of the signed score towards the right answer."""
        from scipy.stats import norm

        mean = (self.counts * self.weights * norm.ppf(self.p_item(d))).sum(axis=-1)
        return mean, float(np.sqrt((self.counts * self.weights**2).sum()))

    def draw(self, rng: np.random.Generator, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, sd = self.moments(d)
        s = rng.normal(mean, sd)
        return confidence(s), s > 0


def stages(cheap_accuracy: float, evidence: str = "votes") -> tuple[VoteStage, VoteStage]:
    """The cheap judge (one referee, both orders) and the panel (the five built-in roles, both orders)."""
    kind = TokenStage if evidence == "tokens" else VoteStage
    return kind([(cheap_accuracy, 2)]), kind(panel_groups(SimKnobs()))


class Population:
    """Every pair of vote outcomes (cheap x panel) on a mix: raw confidences, agreement and joint probability."""

    def __init__(self, cheap: VoteStage, panel: VoteStage, spread: float):
        self.spread = spread
        d = grid(spread)
        a, b = cheap.outcome_rates(d), panel.outcome_rates(d)
        self.prob = (a[:, None, :] * b[None, :, :]).mean(axis=-1).ravel()  # independent given d
        sa, sb = cheap.score(cheap.outcomes), panel.score(panel.outcomes)
        ia, ib = (g.ravel() for g in np.meshgrid(np.arange(len(sa)), np.arange(len(sb)), indexing="ij"))
        self.conf = (confidence(sa)[ia], confidence(sb)[ib])
        self.agreed = (sa[ia] > 0, sb[ib] > 0)

    def alone(self) -> tuple[float, float]:
        """Agreement of the cheap judge and of the panel on every item."""
        return float(self.prob[self.agreed[0]].sum()), float(self.prob[self.agreed[1]].sum())

    def rates(self, maps, thresholds: list[float | None], panel_cost: float) -> dict:
        conf = (mapped(maps[0], self.conf[0]), mapped(maps[1], self.conf[1]))
        return rates(leaves(conf, thresholds), self.agreed, self.prob, panel_cost)


class TokenPopulation:
    """Both stages' scores are normal given ``d``: a stage keeps an item when ``|score|`` clears its cutoff."""

    def __init__(self, cheap: TokenStage, panel: TokenStage, spread: float):
        self.spread = spread
        d = grid(spread)
        self.moments = (cheap.moments(d), panel.moments(d))

    def alone(self) -> tuple[float, float]:
        from scipy.stats import norm

        return tuple(float(norm.cdf(mean / sd).mean()) for mean, sd in self.moments)

    def rates(self, maps, thresholds: list[float | None], panel_cost: float) -> dict:
        """Shares and agreement, integrating each stage's normal score over ``d`` (see ``rates``)."""
        from scipy.stats import norm

        kept = []
        for (mean, sd), cmap, t in zip(self.moments, maps, thresholds):
            c = score_cutoff(cmap, t)
            kept.append((norm.sf((c - mean) / sd), norm.cdf((-c - mean) / sd)))  # (right, wrong), per d
        (r1, w1), (r2, w2) = kept
        rest = 1 - r1 - w1
        share = [float((r1 + w1).mean()), float((rest * (r2 + w2)).mean())]
        return _figures(share, float((r1 + rest * r2).mean()), panel_cost)


def score_cutoff(cmap, threshold: float | None) -> float:
    """The ``|score|`` at and above which a stage's mapped confidence clears ``threshold`` (``inf``: never).

    The map is non-decreasing and linear between its breakpoints, so the kept set is an interval ``[c, inf)``.
    """
    if threshold is None:
        return math.inf
    raw, cal = np.asarray(cmap.raw), np.asarray(cmap.calibrated)
    above = np.flatnonzero(cal >= threshold)
    if not above.size:
        return math.inf
    j = int(above[0])
    r = raw[0] if j == 0 else raw[j - 1] + (threshold - cal[j - 1]) / (cal[j] - cal[j - 1]) * (raw[j] - raw[j - 1])
    if j == 0 or r <= 0.5:
        return 0.0
    return math.inf if r >= 1 else math.log(r / (1 - r))


def population(pair: tuple[VoteStage, VoteStage], spread: float) -> Population | TokenPopulation:
    return TokenPopulation(*pair, spread) if isinstance(pair[0], TokenStage) else Population(*pair, spread)


def mapped(cmap, raw: np.ndarray) -> np.ndarray:
    return np.interp(raw, cmap.raw, cmap.calibrated)


def leaves(conf: tuple[np.ndarray, np.ndarray], thresholds: list[float | None]) -> np.ndarray:
    """The stage (0, 1) each item leaves at, or -1 (to a person): its first stage whose confidence clears it."""
    out = np.full(conf[0].shape, -1)
    for s in (1, 0):  # the earlier stage wins: written last
        t = thresholds[s]
        if t is not None:
            out[conf[s] >= t] = s
    return out


def rates(left: np.ndarray, agreed: tuple, weight: np.ndarray, panel_cost: float) -> dict:
    """Shares left at each stage and to a person, agreement of the verdicts given, units spent per item."""
    total = weight.sum()
    share = [float(weight[left == s].sum() / total) for s in (0, 1)]
    return _figures(share, sum(float(weight[(left == s) & agreed[s]].sum()) for s in (0, 1)) / total, panel_cost)


def _figures(share: list[float], right: float, panel_cost: float) -> dict:
    """From the shares left at each stage and the share left with a right verdict."""
    given = share[0] + share[1]
    return {"stage1": share[0], "stage2": share[1], "person": max(0.0, 1 - given), "coverage": given,
            "agreement": right / given if given else math.nan, "units": 1 + panel_cost * (1 - share[0])}


def one_draw(pair: tuple[VoteStage, VoteStage], pop, args, level: float, rng: np.random.Generator,
             calibrate_on: float) -> dict:
    """One calibration draw: maps and thresholds chosen on it, then the cascade on the use mix (exact and fresh)."""
    cheap, panel = pair
    d = calibrate_on * rng.random(args.calibration)
    (c1, a1), (c2, a2) = cheap.draw(rng, d), panel.draw(rng, d)
    maps = fit_confidence_map(c1, a1), fit_confidence_map(c2, a2)
    chosen = choose_cascade_thresholds([(mapped(maps[0], c1).tolist(), a1.tolist()),
                                        (mapped(maps[1], c2).tolist(), a2.tolist())], level=level, risk=args.risk)
    thresholds = [s.threshold for s in chosen.stages]
    exact = pop.rates(maps, thresholds, args.panel_cost)
    fd = pop.spread * rng.random(args.fresh)
    (f1, fa1), (f2, fa2) = cheap.draw(rng, fd), panel.draw(rng, fd)
    fresh_conf = (mapped(maps[0], f1), mapped(maps[1], f2))
    fresh = rates(leaves(fresh_conf, thresholds), (fa1, fa2), np.ones(args.fresh), args.panel_cost)
    return {"thresholds": thresholds, "exact": exact, "fresh": fresh,
            "ece": [expected_calibration_error(fresh_conf[0], fa1), expected_calibration_error(fresh_conf[1], fa2)]}


def held(r: dict, level: float) -> bool:
    """The guarantee held on this draw: its verdicts agree at least ``level`` (vacuously when it gives none)."""
    return r["coverage"] == 0 or r["agreement"] >= level


def run_row(cheap_accuracy: float, args, *, evidence: str, level: float | None, calibrate_on: float, use_on: float,
            rng: np.random.Generator) -> dict:
    """One row: ``args.draws`` calibration draws of the cascade, and how it did on the use mix."""
    pair = stages(cheap_accuracy, evidence)
    pop = population(pair, use_on)
    cheap_alone, panel_alone = pop.alone()
    level = level if level is not None else math.floor(panel_alone * 1000) / 1000
    draws = [one_draw(pair, pop, args, level, rng, calibrate_on) for _ in range(args.draws)]
    exact = [r["exact"] for r in draws]
    reached = [r for r in draws if any(t is not None for t in r["thresholds"])]
    units, coverage = sum(e["units"] for e in exact), sum(e["coverage"] for e in exact)
    n = len(draws)
    return {"evidence": evidence, "cheap_accuracy": cheap_accuracy, "calibrate_spread": calibrate_on, "use_spread": use_on,
            "level": level, "risk": args.risk, "draws": n, "panel_cost": args.panel_cost,
            "held": proportion(sum(held(e, level) for e in exact), n),
            "held_fresh": proportion(sum(held(r["fresh"], level) for r in draws), n),
            "reached": proportion(len(reached), n),
            "stage1_reached": proportion(sum(r["thresholds"][0] is not None for r in draws), n),
            "shares": {k: float(np.mean([e[k] for e in exact])) for k in ("stage1", "stage2", "person", "coverage")},
            "units_per_item": units / n, "units_per_verdict": units / coverage if coverage else math.nan,
            "cost_ratio": units / coverage / args.panel_cost if coverage else math.nan,
            "coverage": over_draws([e["coverage"] for e in exact]),
            "agreement": over_draws([e["agreement"] for e in exact if e["coverage"] > 0]),
            "panel_alone": {"agreement": panel_alone, "units_per_verdict": args.panel_cost},
            "cheap_alone": {"agreement": cheap_alone, "units_per_verdict": 1.0},
            "ece_cheap": over_draws([r["ece"][0] for r in draws]), "ece_panel": over_draws([r["ece"][1] for r in draws])}


def _accuracies(spec: str) -> list[float]:
    values = [float(x) for x in spec.split(",") if x.strip()]
    if not values or not all(0.5 < v < 1 for v in values):
        raise ValueError(f"--cheap-accuracies takes accuracies strictly between 0.5 and 1, got {spec!r}")
    return values


def _evidence(spec: str) -> list[str]:
    kinds = [x.strip() for x in spec.split(",") if x.strip()]
    if not kinds or not set(kinds) <= {"votes", "tokens"}:
        raise ValueError(f"--evidence takes votes, tokens or both, got {spec!r}")
    return kinds


def run_cascade(args) -> int:
    """Every row, printed with its intervals (and written to ``--out`` as JSON)."""
    if args.draws < 1 or args.calibration < 1 or args.fresh < 1 or args.panel_cost <= 0:
        print("bench: error: --draws, --calibration, --fresh and --panel-cost must be positive")
        return 2
    try:
        accuracies, kinds = _accuracies(args.cheap_accuracies), _evidence(args.evidence)
    except ValueError as exc:
        print(f"bench: error: {exc}")
        return 2
    rng = np.random.default_rng(args.seed)
    rows = [{"row": name, **run_row(acc, args, evidence=evidence, level=args.level, calibrate_on=calibrate_on,
                                    use_on=args.hard, rng=rng)}
            for evidence, acc in itertools.product(kinds, accuracies)
            for name, calibrate_on in (("exchangeable", args.hard), ("control", args.easy))]
    print(render(rows, args))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


def _pct(d: dict, fmt: str = ".1%") -> str:
    if not d["n"]:
        return "n/a"
    return f"{d['value']:{fmt}} [{d['p2_5']:{fmt}}, {d['p97_5']:{fmt}}]"


def render(rows: list[dict], args) -> str:
    """The rows as text: every figure with its n (draws) and interval."""
    lines = [f"Cascade: simulated referees (sim_lm's model with item difficulty, numpy draws, no LM): stage 1 a cheap "
             f"judge (1 referee, both orders), stage 2 the panel (5 built-in roles, untuned, both orders); "
             f"{args.calibration} calibration items per draw, {args.draws} draws per row, risk {args.risk}, "
             f"seed {args.seed}; thresholds by choose_cascade_thresholds on isotonic-mapped confidences. Shares of "
             f"draws: exact 95% CIs; coverage/agreement: mean [2.5-97.5 pct] over draws, exact on the use mix. Cost "
             f"units: cheap judge 1 per item, panel {args.panel_cost:g} per item it judges; people not counted. Evidence: "
             f"votes (each call a vote), tokens (each call also its token probabilities, an assumed Thurstonian "
             f"model; no ties).",
             f"{'row':13s} {'evidence':8s} {'cheap p':7s} {'cal/use':9s} {'level':6s} {'held (population)':22s} "
             f"{'held (' + str(args.fresh) + ' fresh)':22s} {'threshold reached':22s} "
             f"{'stage1/stage2/person':22s} {'coverage':22s} {'agreement given':22s} units/item units/verdict "
             f"ratio vs panel"]
    for r in rows:
        sh = r["shares"]
        lines.append(f"{r['row']:13s} {r['evidence']:8s} {r['cheap_accuracy']:<7.2f} "
                     f"{r['calibrate_spread']:.1f}/{r['use_spread']:.1f}   "
                     f"{r['level']:<6.3f} {rate_text(r['held']):22s} {rate_text(r['held_fresh']):22s} "
                     f"{rate_text(r['reached']):22s} "
                     f"{sh['stage1']:.3f}/{sh['stage2']:.3f}/{sh['person']:.3f}{'':3s} {_pct(r['coverage']):22s} "
                     f"{_pct(r['agreement']):22s} {r['units_per_item']:<10.3f} {r['units_per_verdict']:<13.3f} "
                     f"{r['cost_ratio']:.3f}x")
    for r in rows:
        if r["row"] != "exchangeable":
            continue
        lines.append(f"{r['evidence']}, cheap p {r['cheap_accuracy']:.2f}, spread {r['use_spread']:.1f}: panel on every "
                     f"item agreement "
                     f"{r['panel_alone']['agreement']:.3f} at {r['panel_alone']['units_per_verdict']:g} units/verdict; "
                     f"cheap judge on every item {r['cheap_alone']['agreement']:.3f} at 1 unit/verdict (exact); "
                     f"ECE on {args.fresh} fresh items (mean [2.5-97.5 pct]): cheap {_pct(r['ece_cheap'], '.3f')}, panel "
                     f"{_pct(r['ece_panel'], '.3f')}; target cost <= 0.5x: "
                     f"{'met' if r['cost_ratio'] <= 0.5 else 'NOT met'} ({r['cost_ratio']:.3f}x); guarantee held in "
                     f">= {1 - args.risk:.0%} of draws: {'met' if r['held']['value'] >= 1 - args.risk else 'NOT met'}")
    return "\n".join(lines)
