"""Gates on a judge certificate: what ``chateval compile`` and ``chateval search`` check before they register a
saved evaluator (``--register``), and refuse when a figure fails. Those commands measure the figures their gates
read on the evaluator they have just saved (``optim.certify.measure``); ``check_gates`` reads a certificate however
it was filled.

``check_gates`` is a pure function of the card's certificate (``chateval_dspy.deploy.saved.certificate``) and the
``Gates`` asked for; it returns every failure, each naming the figure, its value with its 95% interval and n, the
gate, and, where the certificate lacks the figure, the command that measures it. A gate compares the figure's
point value (its interval is shown beside it, so a reader sees how sure the pass or the failure is).

- ``replaces-annotator`` (``--require``): the alternative annotator test says the panel can replace an annotator
  on the people's data (``chateval certify --program``);
- ``max_position_flips``: the flip rate under swapped answers, with the position calibration the evaluator runs
  with (``chateval audit``);
- ``min_robustness``: every text probe's robustness rate (verbosity, authority, bandwagon, distraction).
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
    gate = "--require replaces-annotator (alternative annotator test: omega >= 0.5)"
    if test is None:
        return [Failure("alternative annotator test", "not in the certificate", gate, fix)]
    if test["replaces"] is None:
        return [Failure("alternative annotator test", f"not tested: {test['missing']}", gate, fix)]
    if not test["replaces"]:
        return [Failure("alternative annotator test", f"does not replace an annotator (omega={test['omega']:.2f}, "
                        f"rho={_shown(test['rho'])}, epsilon={test['epsilon']:g})", gate)]
    return []


def _audit_figures(certificate: dict, figure: str, probe: str | None = None) -> list[dict]:
    return [f for f in (certificate.get("audit") or {}).get("figures", [])
            if f["figure"] == figure and (probe is None or f["probe"] == probe)]


def _position(certificate: dict, limit: float, program: str) -> list[Failure]:
    gate = f"--max-position-flips {limit:g}"
    calibrated = (certificate.get("audit") or {}).get("calibrated")
    probe = f"position ({'calibrated' if calibrated else 'uncalibrated'})"
    found = _audit_figures(certificate, "flip rate", probe)
    if not found:
        return [Failure("position flip rate", "not in the certificate", gate,
                        f"chateval audit {program} --dataset DATA --probes position")]
    block = found[0]["estimate"]
    if block["value"] is None or block["value"] > limit:
        return [Failure(f"{probe} flip rate", _shown(block), gate)]
    return []


def _robustness(certificate: dict, limit: float, program: str) -> list[Failure]:
    gate = f"--min-robustness {limit:g}"
    found = _audit_figures(certificate, "robustness rate")
    if not found:
        return [Failure("robustness rate", "not in the certificate", gate,
                        f"chateval audit {program} --dataset DATA --probes verbosity,authority,bandwagon,distraction")]
    return [Failure(f"{f['probe']} robustness rate", _shown(f["estimate"]), gate) for f in found
            if f["estimate"]["value"] is None or f["estimate"]["value"] < limit]


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
    if gates.max_position_flips is not None:
        failures += _position(certificate, gates.max_position_flips, program)
    if gates.min_robustness is not None:
        failures += _robustness(certificate, gates.min_robustness, program)
    return failures


def enforce(card: dict, gates: Gates | None, program_dir) -> None:
    """Refuse (``GateRefused``, listing every failure) when the saved card's certificate fails a gate.

    Raises:
        GateRefused: naming the evaluator, each failing figure with its value, interval and gate, and how to
            measure what is missing, then rerun the same command.
    """
    if gates is None or not gates.any:
        return
    failures = check_gates(card.get("certificate"), gates, program=str(program_dir))
    if failures:
        raise GateRefused(f"{program_dir} fails {len(failures)} gate(s), so it was saved but not registered:\n  "
                          + "\n  ".join(f.line() for f in failures)
                          + f"\nIts certificate, with every figure measured, is in {program_dir}/card.md")
