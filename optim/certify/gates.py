"""Gates on a judge certificate: what ``chateval compile`` and ``chateval search`` check before they register a
saved evaluator (``--register``); the gates themselves: docs/selective.md.

``check_gates`` is a pure function of the card's certificate and the ``Gates`` asked for; it returns every failure,
each naming the figure, its value with its 95% interval and n, the gate, and, where the certificate lacks the figure,
the command that measures it. A gate compares the point value (the interval is shown so a reader sees how sure it is).
"""

from __future__ import annotations

from dataclasses import dataclass

from chateval_dspy.errors import ChatEvalError, ConfigError
from optim.certify.people import People

REQUIREMENTS = ("replaces-annotator",)


class GateRefused(ChatEvalError):
    """A saved evaluator's certificate fails a gate: it was saved, and not registered."""


@dataclass(frozen=True)
class Gates:
    """The gates asked for; None (or an empty ``require``): that gate is not checked. ``people``: several people's
    labels, which ``replaces-annotator`` is measured on (``optim.certify.measure``)."""

    require: tuple[str, ...] = ()
    max_position_flips: float | None = None
    min_robustness: float | None = None
    people: People | None = None

    def __post_init__(self) -> None:
        unknown = [r for r in self.require if r not in REQUIREMENTS]
        if unknown:
            raise ConfigError(f"unknown requirement(s) {', '.join(map(repr, unknown))}; choose from: "
                              f"{', '.join(REQUIREMENTS)}")
        for name in ("max_position_flips", "min_robustness"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ConfigError(f"--{name.replace('_', '-')} is a rate from 0 to 1, got {value}")

    @property
    def any(self) -> bool:
        return bool(self.require) or any(v is not None for v in (self.max_position_flips, self.min_robustness))


@dataclass(frozen=True)
class Failure:
    """One failing gate: the figure, its value (with interval and n, or why there is none), the gate, and the
    command that measures a missing figure."""

    figure: str
    value: str
    gate: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.figure}: {self.value}; gate {self.gate}" + (f"; measure it with: {self.fix}" if self.fix else "")


def _shown(block: dict | None) -> str:
    if block is None or block["value"] is None:
        n = 0 if block is None else block["n"]
        return f"n/a, no item to measure it on (n={n})" if not n else f"n/a (n={n})"
    ci = "no CI" if block["ci_low"] is None else f"95% CI [{block['ci_low']:.3f}, {block['ci_high']:.3f}]"
    return f"{block['value']:.3f} {ci}, n={block['n']}"


def _replaces(certificate: dict, program: str) -> list[Failure]:
    fix = f"chateval certify --program {program} --results RESULTS.jsonl --dataset PEOPLE --annotators A1,A2,A3"
    test = (certificate.get("people") or {}).get("alt_test")
    name, gate = "alternative annotator test", "--require replaces-annotator (alternative annotator test: omega >= 0.5)"
    if test is None or test["replaces"] is None:
        return [Failure(name, "not in the certificate" if test is None else f"not tested: {test['missing']}", gate, fix)]
    if not test["replaces"]:
        return [Failure(name, f"does not replace an annotator (omega={test['omega']:.2f}, "
                        f"rho={_shown(test['rho'])}, epsilon={test['epsilon']:g})", gate)]
    return []


def _audit_gate(certificate: dict, name: str, gate: str, probes: str, program: str, fails, probe: str | None = None):
    """The failures of every audit figure ``name`` (of ``probe``, None: any) whose value ``fails``, or one saying
    that the certificate lacks it and how to measure it (``probes``)."""
    found = [f for f in (certificate.get("audit") or {}).get("figures", [])
             if f["figure"] == name and (probe is None or f["probe"] == probe)]
    if not found:
        return [Failure(f"{'position ' if probe else ''}{name}", "not in the certificate", gate,
                        f"chateval audit {program} --dataset DATA --probes {probes}")]
    return [Failure(f"{f['probe']} {name}", _shown(f["estimate"]), gate) for f in found
            if f["estimate"]["value"] is None or fails(f["estimate"]["value"])]


def check_gates(certificate: dict | None, gates: Gates, *, program: str = "DIR") -> list[Failure]:
    """Every gate of ``gates`` the ``certificate`` (a card's, checked; None: the card has none) fails.
    ``program`` names the evaluator in the commands that measure a missing figure.

    Example:
        >>> rate = {"value": 0.25, "ci_low": 0.1, "ci_high": 0.4, "n": 40}
        >>> cert = {"program": "ab" * 8, "audit": {"calibrated": True, "figures": [
        ...     {"probe": "position (calibrated)", "figure": "flip rate", "estimate": rate}]}}
        >>> [f.line() for f in check_gates(cert, Gates(max_position_flips=0.1))]
        ['position (calibrated) flip rate: 0.250 95% CI [0.100, 0.400], n=40; gate --max-position-flips 0.1']
    """
    certificate = certificate or {}
    failures: list[Failure] = []
    if "replaces-annotator" in gates.require:
        failures += _replaces(certificate, program)
    if (limit := gates.max_position_flips) is not None:
        # the flip rate under the position calibration the evaluator runs with
        probe = f"position ({'calibrated' if (certificate.get('audit') or {}).get('calibrated') else 'uncalibrated'})"
        failures += _audit_gate(certificate, "flip rate", f"--max-position-flips {limit:g}", "position", program,
                                lambda v: v > limit, probe)
    if (least := gates.min_robustness) is not None:
        failures += _audit_gate(certificate, "robustness rate", f"--min-robustness {least:g}",
                                "verbosity,authority,bandwagon,distraction", program, lambda v: v < least)
    return failures


def enforce(card: dict, gates: Gates | None, program_dir) -> None:
    """Refuse (``GateRefused``: the evaluator, each failing figure with its value, interval and gate, how to
    measure what is missing) when the saved card's certificate fails a gate."""
    if gates is None or not gates.any:
        return
    failures = check_gates(card.get("certificate"), gates, program=str(program_dir))
    if failures:
        raise GateRefused(f"{program_dir} fails {len(failures)} gate(s), so it was saved but not registered:\n  "
                          + "\n  ".join(f.line() for f in failures)
                          + f"\nIts certificate, with every figure measured, is in {program_dir}/card.md")
