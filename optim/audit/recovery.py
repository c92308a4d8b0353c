"""Does the audit recover biases planted in simulated referees? The benchmark behind BENCHMARKS.md "Certificate".

Each row plants one bias of a known size (``sim_lm``'s ``position_bias``, ``verbosity_bias``) in referees otherwise
always right, and audits synthetic pairs through the real program; a panel (``mean``) moves at the rate ``expected``
derives. Verbosity rows use pairs whose answers are exactly as long. Method and figures: benchmarks/certificate.md.

    python -m optim.audit.recovery --items 200
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from chateval_dspy.run.metrics import Estimate

# (probe, planted rate, referees): the rows of the table.
PLANTS = (("position", 0.0, 1), ("position", 0.1, 1), ("position", 0.3, 1), ("position", 0.5, 1),
          ("position", 0.3, 3), ("verbosity", 0.0, 1), ("verbosity", 0.2, 1), ("verbosity", 0.4, 1),
          ("verbosity", 0.4, 3))
NAMES = ("question", "answer_1", "answer_2")


@dataclass(frozen=True)
class Recovery:
    """One row: the planted bias, what the audit measured (``second``: flip rate; ``calibrated``: position bias, calibrated)."""

    probe: str
    planted: float
    referees: int
    measured: Estimate
    second: Estimate | None
    calibrated: Estimate | None

    @property
    def expected(self) -> float:
        return expected(self.planted, self.referees)

    @property
    def covered(self) -> bool:
        return self.measured.low <= self.expected <= self.measured.high


def expected(planted: float, referees: int, margin_right: int = 3, margin_wrong: int = 2) -> float:
    """The panel-level rate a planted per-referee bias gives, for referees right on content under ``mean``: the
    panel follows the bias when its ``k`` biased referees' margins outweigh the others' (``k * margin_wrong >
    (referees - k) * margin_right``), each referee biased independently with probability ``planted``.

    Example:
        >>> expected(0.3, 1), round(expected(0.3, 3), 3)  # three referees: two must be biased (2 x 2 > 1 x 3)
        (0.3, 0.216)
    """
    from math import comb

    return sum(comb(referees, k) * planted ** k * (1 - planted) ** (referees - k)
               for k in range(referees + 1) if k * margin_wrong > (referees - k) * margin_right)


def pairs(n: int, *, equal_length: bool, seed: int = 0):
    """``n`` labelled pairs (labels ``1``, ``2`` alternately); with ``equal_length`` both answers are as long."""
    import dspy

    from chateval_dspy.testing.sim_lm import synthetic_items

    if not equal_length:
        return synthetic_items(n, seed=seed, prefix="audit")
    return [dspy.Example(id=f"eq-{seed}-{i}", question=f"Question eq-{seed}-{i}?", answer_1=f"Answer A, eq-{seed}-{i}.",
                         answer_2=f"Answer B, eq-{seed}-{i}.", label="1" if i % 2 == 0 else "2").with_inputs(*NAMES)
            for i in range(n)]


def known(items, seed: int):
    """The items and every perturbation the audit can make of them with ``seed``, labelled (for the simulator)."""
    import dspy

    from optim.audit.perturb import PROBES, variants

    names = dict(zip(NAMES, NAMES))
    out = list(items)
    for x in items:
        for probe in PROBES:
            for p in variants(probe, {"id": x.id, **{k: x[k] for k in NAMES}}, names, seed):
                label = {"1": "2", "2": "1"}[x.label] if probe == "swap" else x.label
                out.append(dspy.Example(**p.item, label=label).with_inputs(*NAMES))
    return out


def measure(probe: str, planted: float, referees: int, *, n: int, seed: int, work: Path) -> Recovery:
    """One row: a saved panel of ``referees`` simulated referees (one round, uncalibrated) with ``planted`` bias."""
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.deploy.saved.judge import Judge
    from chateval_dspy.deploy.saved.store import load_program, save_program
    from chateval_dspy.program.chateval import build_evaluator
    from chateval_dspy.program.roles import DEFAULT_ORDER
    from chateval_dspy.testing.sim_lm import SimKnobs, sim_lm
    from optim.audit.probes import audit

    knobs = SimKnobs(accuracy=(), default_accuracy=1.0, ceiling=1.0, seed=seed, **{f"{probe}_bias": planted})
    items = pairs(n, equal_length=probe == "verbosity", seed=seed)
    folder = work / f"{probe}-{planted}-{referees}"
    program = build_evaluator(DebateConfig(roles=tuple(DEFAULT_ORDER[:referees]), turns=1, calibrate=False))
    save_program(program, folder / "program", make_card(program, model="sim/referees"))
    loaded, card = load_program(folder / "program")
    judge = Judge(loaded, card, sim_lm(knobs, known(items, seed)), contextlib.ExitStack())
    report = audit(judge, items, out=folder / "audit", probes=(probe,), seed=seed)
    got = {(f.probe, f.figure): f.estimate for f in report.findings}
    if probe == "position":
        return Recovery(probe, planted, referees, got[("position (uncalibrated)", "position bias")],
                        got[("position (uncalibrated)", "flip rate")], got[("position (calibrated)", "position bias")])
    return Recovery(probe, planted, referees, got[("verbosity", "towards boosted")], None, None)


def recover(plants=PLANTS, *, n: int = 200, seed: int = 0, work: str | Path | None = None) -> list[Recovery]:
    """Every row of ``plants`` on ``n`` items each (in ``work``, default a temporary folder)."""
    with contextlib.ExitStack() as stack:
        folder = Path(work) if work else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="audit-rec-")))
        return [measure(probe, rate, referees, n=n, seed=seed, work=folder) for probe, rate, referees in plants]


def _cell(e: Estimate | None) -> str:
    return "" if e is None else f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"


def markdown(rows: list[Recovery], n: int, seed: int) -> str:
    """The table: planted rate, the measured figure with its 95% CI and whether the CI covers the planted rate.

    Example:
        >>> row = Recovery("position", 0.3, 1, Estimate(0.28, 0.19, 0.37, 400), None, None)
        >>> markdown([row], 200, 0).splitlines()[-1]
        '| position | 1 | 0.30 | 0.300 | 0.280 [0.190, 0.370] | yes |  |  |'
    """
    out = [f"Model: simulated referees right on content (sim_lm), one round, uncalibrated panel; data: {n} synthetic "
           f"pairs per row, seed {seed}; 95% CIs exact (Clopper-Pearson; position bias = 2 x first-position rate - 1).",
           "",
           "| probe | referees | planted per referee | expected for the panel | measured (position bias / towards "
           "longer) | CI covers expected | flip rate | position bias, calibrated |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.probe} | {r.referees} | {r.planted:.2f} | {r.expected:.3f} | {_cell(r.measured)} | "
                   f"{'yes' if r.covered else 'no'} | {_cell(r.second)} | {_cell(r.calibrated)} |")
    return "\n".join(out)


if __name__ == "__main__":
    import argparse

    from chateval_dspy.lm.offline import ensure_offline

    parser = argparse.ArgumentParser(prog="python -m optim.audit.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ensure_offline()
    print(markdown(recover(n=args.items, seed=args.seed), args.items, args.seed))
