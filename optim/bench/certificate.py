"""Does the alternative annotator test tell a better judge from a worse one, at its stated false discovery rate?

Simulated studies (``chateval_dspy.testing.sim_annotators``), no LM. Which nulls are true is measured on one study of
``--population-items`` items; a draw's false discovery proportion is the share of its rejections that reject a true
null (0 without any). Method and figures: benchmarks/certificate.md.

    python -m optim.bench certificate --draws 200
"""

from __future__ import annotations

import math

ROWS = {"better": 0.9, "equal": 0.75, "slightly worse": 0.6, "worse": 0.45}
DRAW_RESAMPLES = 100  # rho's CI is not reported per draw; a rough one keeps 800 draws to seconds


def add_parser(sub) -> None:
    ce = sub.add_parser("certificate", help="the alternative annotator test over simulated studies: how often it "
                                            "says 'replaces' for judges planted better or worse, and its FDR (no LM)")
    ce.add_argument("--draws", type=int, default=200, help="studies per row (default 200)")
    ce.add_argument("--items", type=int, default=100, help="items per study (default 100)")
    ce.add_argument("--people", type=int, default=3, help="people per study (default 3)")
    ce.add_argument("--person-accuracy", type=float, default=0.75, help="each person's accuracy (default 0.75)")
    ce.add_argument("--epsilon", type=float, default=0.1, help="the test's margin (default 0.1, crowd-workers)")
    ce.add_argument("--population-items", type=int, default=100_000,
                    help="items of the one large study that measures which nulls are true (default 100000)")
    ce.add_argument("--seed", type=int, default=0)


def population_gap(judge: float, args) -> list[float]:
    """Each person's population ``rho_h - rho_f`` for a judge of accuracy ``judge`` (one very large study)."""
    import numpy as np

    from chateval_dspy.testing.sim_annotators import simulate
    from optim.certify.alt_test import indicators

    study = simulate(args.population_items, [args.person_accuracy] * args.people, judge, seed=args.seed + 10_000)
    gaps = []
    for who in sorted(next(iter(study.people.values()))):
        wins = indicators(who, study.judge, study.people, "accuracy")
        gaps.append(float(np.mean([h - f for f, h in wins.values()])))
    return gaps


def run_row(judge: float, args, offset: int) -> dict:
    """``args.draws`` studies with a judge of accuracy ``judge``: the verdicts, omega, rho and the FDR."""
    import numpy as np

    from chateval_dspy.testing.sim_annotators import simulate
    from optim.bench.stats import proportion
    from optim.certify.alt_test import alt_test

    gaps = population_gap(judge, args)
    true_null = [g >= args.epsilon for g in gaps]
    replaces, omegas, rhos, fdp = 0, [], [], []
    for draw in range(args.draws):
        study = simulate(args.items, [args.person_accuracy] * args.people, judge, seed=args.seed + offset + draw)
        result = alt_test(study.judge, study.people, epsilon=args.epsilon, n_resamples=DRAW_RESAMPLES)
        rejected = [c.rejected for c in result.comparisons]
        replaces += bool(result.replaces)
        omegas.append(result.omega)
        rhos.append(result.rho.value)
        false = sum(r and t for r, t in zip(rejected, true_null))
        fdp.append(false / sum(rejected) if any(rejected) else 0.0)
    row = {"judge_accuracy": judge, "population_gap": gaps, "true_nulls": sum(true_null),
           "replaces": proportion(replaces, args.draws), "omega_mean": float(np.mean(omegas)),
           "rho_mean": float(np.mean(rhos)), "fdr": float(np.mean(fdp))}
    if all(true_null):
        row["fdr"] = proportion(int(sum(fdp)), args.draws)
    return row


def _rate(d) -> str:
    if isinstance(d, float):
        return f"{d:.1%}"
    return f"{d['value']:.1%} [{d['ci_low']:.1%}, {d['ci_high']:.1%}]" if not math.isnan(d["value"]) else "n/a"


def render(rows: dict, args) -> str:
    from optim.certify.alt_test import Q_FDR

    lines = [f"Certificate: the alternative annotator test on simulated studies (no LM): {args.items} items, "
             f"{args.people} people of accuracy {args.person_accuracy} over 3 classes with item difficulty, epsilon "
             f"{args.epsilon}, Benjamini-Yekutieli q={Q_FDR}; {args.draws} draws per row, seed {args.seed}; exact 95% "
             "CIs over draws",
             f"{'row':15s} {'judge acc':9s} {'rho_h - rho_f (population)':28s} {'true nulls':10s} "
             f"{'says replaces':26s} {'mean omega':10s} {'mean rho':8s} FDR"]
    for name, r in rows.items():
        gaps = ", ".join(f"{g:+.3f}" for g in r["population_gap"])
        fdr = _rate(r["fdr"]) if r["true_nulls"] else "- (no true null)"
        lines.append(f"{name:15s} {r['judge_accuracy']:<9.2f} {gaps:28s} {r['true_nulls']:<10d} "
                     f"{_rate(r['replaces']):26s} {r['omega_mean']:<10.2f} {r['rho_mean']:<8.3f} {fdr}")
    return "\n".join(lines)


def run_certificate(args) -> int:
    """Every row of ``ROWS``, printed."""
    if args.draws < 1 or args.items < 1 or args.people < 1:
        print("bench: error: --draws, --items and --people must be positive")
        return 2
    rows = {name: run_row(judge, args, offset=i * args.draws) for i, (name, judge) in enumerate(ROWS.items())}
    print(render(rows, args))
    return 0
