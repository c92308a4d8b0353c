"""What a gated ``chateval compile`` or ``chateval search`` measures on the evaluator it has just saved, before it is
registered: each figure a gate reads (``gates``), on the test split (which neither the optimizer nor the search saw);
people's labels of other items are left out, and the certificate says how many remain. The audit writes into
``<out>/results/gates-audit-<digest of program.json>``: a rerun resumes it, another program gets a folder of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path

from chateval_dspy.errors import ConfigError
from optim.audit.probes import ROBUSTNESS_PROBES
from optim.certify.gates import Gates, enforce

SHOWN_IDS = 5


@dataclass(frozen=True)
class HeldOut:
    """The test split a gated command measures on: its items, the results file of the saved panel's verdicts on
    them, and how the certificate names them."""

    items: list
    results: Path
    name: str


def held_out_name(dataset, seed: int, n: int) -> str:
    """How the certificate names the test split.

    Example:
        >>> held_out_name("faireval", 0, 20)
        'faireval test split (seed 0), 20 items'
    """
    return f"{dataset or 'labelled items'} test split (seed {seed}), {n} items"


def audit_probes(gates: Gates, fmt: str) -> tuple[str, ...]:
    """The audit's probes that ``gates`` read, for items of format ``fmt``.

    Example:
        >>> audit_probes(Gates(max_position_flips=0.1, min_robustness=0.9), "pointwise")
        ('verbosity', 'authority', 'distraction')
    """
    from optim.audit.perturb import applies

    probes = ("position",) if gates.max_position_flips is not None and fmt == "pairwise" else ()
    if gates.min_robustness is not None:
        probes += tuple(p for p in ROBUSTNESS_PROBES if applies(p, fmt))
    return probes


def check_gate_data(gates: Gates | None, fmt: str, test_ids) -> None:
    """Refuse a gate whose data is missing (before any LM call), naming the gate and what to pass; the people's
    labels must cover some of ``test_ids`` (the test split's items)."""
    if gates is None or not gates.any:
        return
    if gates.max_position_flips is not None and fmt != "pairwise":
        raise ConfigError("--max-position-flips measures verdicts with the answers swapped; a pointwise item has one "
                          "response: drop --max-position-flips (--min-robustness applies to pointwise items)")
    if "replaces-annotator" not in gates.require:
        return
    if gates.people is None:
        raise ConfigError("--require replaces-annotator runs the alternative annotator test, which needs several "
                          "people's labels of the test split's items: pass --people FILE --annotators A1,A2,A3 "
                          "(one label column per person; without --annotators a long file of id,annotator,label), "
                          "or --people mlflow:<experiment> (the review page's reviewers)")
    test_ids = [str(i) for i in test_ids]
    if not set(gates.people.labels) & set(test_ids):
        raise ConfigError(f"--require replaces-annotator: the people's labels ({gates.people.source}) cover none of "
                          f"the {len(test_ids)} test split item(s) (e.g. {sorted(test_ids)[:SHOWN_IDS]}), and the "
                          "test compares the panel with the people on items tuning never saw: label those items")


def measure_audit(out: Path, program, gates: Gates, *, lm, held_out: HeldOut, seed: int, concurrency: int):
    """The audit's probes the gates read, run on the saved ``program`` over the test split, written into the card's
    certificate (``audit`` part). Returns the certificate, or None when no bias gate is set."""
    from chateval_dspy.deploy.saved.judge import Judge
    from chateval_dspy.deploy.saved.store import read_card
    from chateval_dspy.run.evaluate_dataset import lm_slots
    from optim.audit.probes import audit
    from optim.certify.certificate import audit_part, fill

    probes = audit_probes(gates, program.config.format)
    if not probes:
        return None
    digest = hashlib.sha256((Path(out) / "program.json").read_bytes()).hexdigest()[:12]  # a folder per saved program
    folder = Path(out) / "results" / f"gates-audit-{digest}"
    with lm.judging(lm_slots(program.config, concurrency)) as judging_lm:
        judge = Judge(program, read_card(out), judging_lm, contextlib.ExitStack())
        report = audit(judge, held_out.items, out=folder, probes=probes, seed=seed, concurrency=concurrency,
                       data=held_out.name)
    return fill(out, "audit", audit_part(report, calibrated=program.config.calibrate))


def measure_people(out: Path, program, gates: Gates, *, held_out: HeldOut, seed: int):
    """The alternative annotator test of the panel's test verdicts against the people, written into the card's
    certificate (``people`` part). Returns the certificate, or None without ``--require replaces-annotator``."""
    from optim.certify.certificate import fill, people_part
    from optim.certify.people import People
    from optim.certify.report import certify_judged, read_verdicts

    if "replaces-annotator" not in gates.require:
        return None
    labelled = {i: v for i, v in read_verdicts(held_out.results).items() if i in gates.people.labels}
    people = People({i: by for i, by in gates.people.labels.items() if i in labelled}, gates.people.source)
    level = "nominal" if program.config.format == "pairwise" else None
    cert = certify_judged(labelled, people, results=str(held_out.results), level=level, seed=seed)
    return fill(out, "people", people_part(cert))


def measure_and_enforce(out: str | Path, program, gates: Gates | None, *, lm, held_out: HeldOut, seed: int = 0,
                        concurrency: int = 1):
    """Measure what ``gates`` read on the evaluator saved in ``out`` (``program``, on ``lm``: an ``LMSpec``) and
    check them (``GateRefused`` lists every failure: nothing is to be registered). Returns ``(card, certificate)``:
    the card as saved now, and the certificate measured (None when no gate is set)."""
    from chateval_dspy.deploy.saved.store import read_card

    out, certificate = Path(out), None
    if gates is not None and gates.any:
        audited = measure_audit(out, program, gates, lm=lm, held_out=held_out, seed=seed, concurrency=concurrency)
        certificate = measure_people(out, program, gates, held_out=held_out, seed=seed) or audited  # the last holds all
    card = read_card(out)  # with the certificate an unchanged program keeps from an earlier save
    enforce(card, gates, out)
    return card, certificate
