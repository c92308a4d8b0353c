"""The judge certificate of a saved evaluator: the parts ``chateval certify --program``, ``chateval audit`` and
``chateval calibrate`` measure, written into its card (schema and checks: ``chateval_dspy.deploy.saved.certificate``),
read back as a frozen ``CardCertificate``, and logged to MLflow.

Each command fills its own part, replacing that part; the cost per 1,000 verdicts is taken from the card's cost
block each time a part is written. A figure is stored as ``{value, ci_low, ci_high, n}``, NaN as null.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from chateval_dspy.deploy.saved.certificate import MAX_FIGURES, MAX_LINE, MAX_TEXT, check_certificate
from chateval_dspy.run.metrics import Estimate

COST_SOURCE = "the card's cost block (test split the evaluator was saved with)"


def figure(estimate: Estimate) -> dict:
    """An ``Estimate`` as the certificate stores it: NaN as null (JSON has no NaN).

    Example:
        >>> figure(Estimate(0.5, 0.25, 0.75, 40)), figure(Estimate(math.nan, math.nan, math.nan, 1))
        ({'value': 0.5, 'ci_low': 0.25, 'ci_high': 0.75, 'n': 40}, {'value': None, 'ci_low': None, 'ci_high': None, 'n': 1})
    """
    bounds = {k: None if v is None or math.isnan(v) else float(v) for k, v in estimate.to_dict().items() if k != "n"}
    return {**bounds, "n": int(estimate.n)}


def estimate(block: dict) -> Estimate:
    """The stored figure back as an ``Estimate`` (null as NaN)."""
    return Estimate(*(math.nan if block[k] is None else float(block[k]) for k in ("value", "ci_low", "ci_high")), block["n"])


def _short(text, limit: int = MAX_TEXT) -> str:
    return str(text) if len(str(text)) <= limit else str(text)[:limit - 3] + "..."


def people_part(cert) -> dict:
    """The ``people`` part from ``certify``'s result (``alt_test`` None without the panel's results)."""
    test, alt, among = cert.test, None, cert.among
    if len(among) > MAX_FIGURES:  # many people: the first pairs' kappas, then Fleiss' kappa and Krippendorff's alpha
        among = among[:MAX_FIGURES - 2] + among[-2:]
    if test is not None:
        omega = None if math.isnan(test.omega) else test.omega
        alt = {"replaces": test.replaces, "omega": omega, "rho": figure(test.rho), "epsilon": test.epsilon,
               "q": test.q, "p_values": {_short(c.annotator): c.p_value for c in test.comparisons},
               "line": _short(test.line(), MAX_LINE), "missing": None if test.missing is None
               else _short(test.missing, MAX_LINE)}
    return {"data": _short(cert.people.source), "results": None if cert.results is None else _short(cert.results),
            "n": len(cert.people.labels), "people": len(cert.people.annotators()), "level": cert.level,
            "agreement": [{"name": _short(f.name), "estimate": figure(f.estimate)} for f in among],
            "panel": [{"person": _short(r.person), "people": figure(r.people), "panel": figure(r.panel)}
                      for r in cert.beside],
            "alt_test": alt}


def audit_part(report, *, calibrated: bool) -> dict:
    """The ``audit`` part from an ``optim.audit.probes.AuditReport``: every figure with an estimate.
    ``calibrated``: whether the saved evaluator runs with position calibration (which position figure gates read)."""
    figures = [{"probe": _short(f.probe), "figure": _short(f.figure), "estimate": figure(f.estimate)}
               for f in report.findings if f.estimate is not None]
    n = max((f["estimate"]["n"] for f in figures if f["probe"].startswith("position")), default=0)
    return {"data": _short(report.data), "model": _short(report.model), "seed": report.seed,
            "n": n or max((f["estimate"]["n"] for f in figures), default=0), "calibrated": calibrated,
            "figures": figures[:MAX_FIGURES]}


def calibration_part(report) -> dict:
    """The ``calibration`` part from a ``CalibrationReport``: the calibrated confidence's ECE on the check half."""
    header = report.header
    return {"data": _short(header["data"]), "split": _short(f"{header['split']}, check half"),
            "model": _short(header["model"]), "ece": figure(report.ece_calibrated), "n": report.n["check"]}


def cost_part(card: dict) -> dict | None:
    """Dollars and LM calls per 1,000 verdicts from the card's cost block (per item), None when it has none.

    Example:
        >>> cost_part({"cost": {"calls_per_item": 8.0, "cost_usd_per_item": 0.0002}})["usd_per_1000"]
        0.2
    """
    cost = card.get("cost")
    if not isinstance(cost, dict):
        return None
    usd, calls = cost.get("cost_usd_per_item"), cost.get("calls_per_item")

    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)
    return {"usd_per_1000": round(usd * 1000, 10) if number(usd) else "unpriced" if usd == "unpriced" else None,
            "calls_per_1000": calls * 1000 if number(calls) else None, "source": COST_SOURCE}


@dataclass(frozen=True)
class CardCertificate:
    """A saved evaluator's certificate, as its card holds it (checked): the program it was measured on and its
    parts, each None when no command has filled it."""

    program: str
    people: dict | None = None
    audit: dict | None = None
    calibration: dict | None = None
    cost: dict | None = None

    @classmethod
    def from_dict(cls, block: dict, where="certificate") -> CardCertificate:
        """The certificate of a card, checked as untrusted (``check_certificate``)."""
        check_certificate(block, where)
        return cls(block["program"], block.get("people"), block.get("audit"), block.get("calibration"),
                   block.get("cost"))

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def metrics(self) -> dict[str, Estimate | float]:
        """Every figure for MLflow: ``certificate.<part>.<figure>`` (estimates with their intervals)."""
        out: dict[str, Estimate | float] = {}
        if self.people:
            out.update({_key("people", f["name"]): estimate(f["estimate"]) for f in self.people["agreement"]})
            test = self.people["alt_test"]
            if test is not None:
                out["certificate.people.alt_test_rho"] = estimate(test["rho"])
                if test["omega"] is not None:
                    out["certificate.people.alt_test_omega"] = test["omega"]
                if test["replaces"] is not None:
                    out["certificate.people.replaces_annotator"] = float(test["replaces"])
        out.update({_key("audit", f"{f['probe']} {f['figure']}"): estimate(f["estimate"])
                    for f in (self.audit or {}).get("figures", [])})
        if self.calibration:
            out["certificate.calibration.ece"] = estimate(self.calibration["ece"])
        if self.cost and isinstance(self.cost["usd_per_1000"], (int, float)):
            out["certificate.cost.usd_per_1000"] = self.cost["usd_per_1000"]
        return out


def _key(part: str, name: str) -> str:
    return f"certificate.{part}." + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def fill(program_dir: str | Path, part: str, block: dict) -> CardCertificate:
    """Write ``block`` as the certificate's ``part`` into the card of the evaluator saved in ``program_dir``
    (parts measured on another program are dropped), with the cost per 1,000 verdicts."""
    from chateval_dspy.deploy.saved.store import read_card, save_certificate

    cost = cost_part(read_card(program_dir))
    if cost is not None:
        save_certificate(program_dir, "cost", cost)
    return CardCertificate.from_dict(save_certificate(program_dir, part, block), Path(program_dir) / "card.json")


def log_certificate(certificate: CardCertificate, program_dir: str | Path) -> None:
    """Log the certificate's figures to the active MLflow run, and the card that holds it (json and md)."""
    from optim.tracking import runs

    runs.log_metrics(certificate.metrics())
    for name in ("card.json", "card.md"):
        runs.log_file(Path(program_dir) / name, "certificate")


def log_run(certificate: CardCertificate, program_dir: str | Path, *, command: str, params: dict,
            uri: str | None = None) -> str:
    """The id of a new MLflow run of ``command`` holding ``params`` and the certificate (``log_certificate``)."""
    from optim.tracking import runs

    with runs.run(command, params={**params, "program": str(program_dir)}, tags={"chateval.command": command},
                  uri=uri) as active:
        log_certificate(certificate, program_dir)
        return active.info.run_id
