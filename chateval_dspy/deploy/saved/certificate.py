"""A card's ``certificate``: the figures a team decides on before letting the panel stand in for its annotators (which
command fills which part: docs/selective.md, "The certificate"), checked as untrusted input (``check_certificate``)
and bound to the program it was measured on (``program_digest``: a card naming another program is refused).

Every figure is ``{value, ci_low, ci_high, n}``, its value in the figure's range and inside its interval; lists and
texts are bounded.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from chateval_dspy.errors import ConfigError, shown

PARTS = ("people", "audit", "calibration", "cost")
CERTIFICATE_KEYS = ("program", *PARTS)
DIGEST = re.compile(r"^[0-9a-f]{16,64}$")
MAX_TEXT = 300  # a data name, a model name, a person, a figure's name
MAX_LINE = 4_000  # the alternative annotator test's line
MAX_FIGURES = 120  # pair kappas of 15 people, or every probe's figures
MAX_PEOPLE = 100  # optim.certify.people.MAX_ANNOTATORS
MAX_N = 10**9
RATE, SIGNED, AGREEMENT, SHIFT = (0.0, 1.0), (-1.0, 1.0), (-2.0, 1.0), (-1_000.0, 1_000.0)
LEVELS = ("nominal", "ordinal", "interval")
ESTIMATE_KEYS = ("value", "ci_low", "ci_high", "n")
PART_KEYS = {
    "people": ("data", "results", "n", "people", "level", "agreement", "panel", "alt_test"),
    "audit": ("data", "model", "seed", "n", "calibrated", "figures"),
    "calibration": ("data", "split", "model", "ece", "n"),
    "cost": ("usd_per_1000", "calls_per_1000", "source"),
}
ALT_TEST_KEYS = ("replaces", "omega", "rho", "epsilon", "q", "p_values", "line", "missing")


def program_digest(state: dict) -> str:
    """The digest of a program's checked state (``untrusted.check_program_state``): instructions and demos.

    Example:
        >>> program_digest({"p": {"signature": {"instructions": "Judge."}, "demos": []}})[:8]
        '5aa57b6e'
    """
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()[:32]


def audit_range(figure: str) -> tuple[float, float]:
    """The range of an audit figure by its name: a score shift is in score points, position bias is signed, the
    rest are rates.

    Example:
        >>> audit_range("flip rate"), audit_range("position bias"), audit_range("score shift coherence")
        ((0.0, 1.0), (-1.0, 1.0), (-1000.0, 1000.0))
    """
    if figure.startswith("score shift"):
        return SHIFT
    return SIGNED if figure == "position bias" else RATE


def _fail(where, key: str, what: str, got) -> ConfigError:
    return ConfigError(f"{where}: key 'certificate.{key}' must be {what}, got {shown(got, 80)}")


def finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value, where, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_N:
        raise _fail(where, key, f"a count from 0 to {MAX_N}", value)
    return value


def _text(value, where, key: str, limit: int = MAX_TEXT, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or len(value) > limit:
        raise _fail(where, key, f"a text of at most {limit} characters", value)


def check_estimate(block, where, key: str, bounds: tuple[float, float]) -> None:
    """One figure: ``value`` in ``bounds`` (or None) inside ``[ci_low, ci_high]`` (or None), ``n`` a count."""
    if not isinstance(block, dict) or set(block) != set(ESTIMATE_KEYS):
        raise _fail(where, key, f"a figure holding exactly {', '.join(ESTIMATE_KEYS)}", block)
    low, high = bounds
    for part in ("value", "ci_low", "ci_high"):
        value = block[part]
        if value is not None and not (finite_number(value) and low <= value <= high):
            raise _fail(where, f"{key}.{part}", f"null or a number from {low:g} to {high:g}", value)
    _count(block["n"], where, f"{key}.n")
    value, ci_low, ci_high = block["value"], block["ci_low"], block["ci_high"]
    if None not in (value, ci_low, ci_high) and not ci_low - 1e-9 <= value <= ci_high + 1e-9:
        raise _fail(where, key, "a value inside its interval", f"{value} outside [{ci_low}, {ci_high}]")


def _keys(block, where, key: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(block, dict) or set(block) != set(keys):
        raise _fail(where, key, f"a mapping of exactly {', '.join(keys)}", block)
    return block


def _entries(value, where, key: str, limit: int, keys: tuple[str, ...]):
    """``(key of the entry, entry)`` of a list of at most ``limit`` mappings of exactly ``keys``."""
    if not isinstance(value, list) or len(value) > limit:
        raise _fail(where, key, f"a list of at most {limit} entries", value)
    for i, entry in enumerate(value):
        yield f"{key}[{i}]", _keys(entry, where, f"{key}[{i}]", keys)


def _check_alt_test(block, where) -> None:
    key = "people.alt_test"
    _keys(block, where, key, ALT_TEST_KEYS)
    if block["replaces"] not in (True, False, None):
        raise _fail(where, f"{key}.replaces", "true, false or null (not tested)", block["replaces"])
    if block["omega"] is not None and not (finite_number(block["omega"]) and 0 <= block["omega"] <= 1):
        raise _fail(where, f"{key}.omega", "null or a number from 0 to 1", block["omega"])
    if block["replaces"] is not None and block["omega"] is None:
        raise _fail(where, f"{key}.omega", "a number when the test has a verdict", None)
    if block["replaces"] is not None and block["replaces"] != (block["omega"] >= 0.5):
        raise _fail(where, f"{key}.replaces", "what omega says (omega >= 0.5)", block["replaces"])
    check_estimate(block["rho"], where, f"{key}.rho", RATE)
    for name, bounds in (("epsilon", (0.0, 1.0)), ("q", (0.0, 1.0))):
        if not (finite_number(block[name]) and bounds[0] <= block[name] < bounds[1]):
            raise _fail(where, f"{key}.{name}", f"a number in [{bounds[0]:g}, {bounds[1]:g})", block[name])
    p_values = block["p_values"]
    if not isinstance(p_values, dict) or len(p_values) > MAX_PEOPLE:
        raise _fail(where, f"{key}.p_values", f"a mapping of at most {MAX_PEOPLE} people to p-values", p_values)
    for person, p in p_values.items():
        _text(person, where, f"{key}.p_values")
        if not (finite_number(p) and 0 <= p <= 1):
            raise _fail(where, f"{key}.p_values.{str(person)[:40]}", "a p-value from 0 to 1", p)
    _text(block["line"], where, f"{key}.line", MAX_LINE)
    _text(block["missing"], where, f"{key}.missing", MAX_LINE, optional=True)


def _check_people(block, where) -> None:
    _keys(block, where, "people", PART_KEYS["people"])
    _text(block["data"], where, "people.data")
    _text(block["results"], where, "people.results", optional=True)
    _count(block["n"], where, "people.n")
    if _count(block["people"], where, "people.people") > MAX_PEOPLE:
        raise _fail(where, "people.people", f"at most {MAX_PEOPLE}", block["people"])
    if block["level"] not in LEVELS:
        raise _fail(where, "people.level", f"one of {', '.join(LEVELS)}", block["level"])
    for at, entry in _entries(block["agreement"], where, "people.agreement", MAX_FIGURES, ("name", "estimate")):
        _text(entry["name"], where, f"{at}.name")
        check_estimate(entry["estimate"], where, f"{at}.estimate", AGREEMENT)
    for at, entry in _entries(block["panel"], where, "people.panel", MAX_PEOPLE, ("person", "people", "panel")):
        _text(entry["person"], where, f"{at}.person")
        check_estimate(entry["people"], where, f"{at}.people", AGREEMENT)
        check_estimate(entry["panel"], where, f"{at}.panel", AGREEMENT)
    if block["alt_test"] is not None:
        _check_alt_test(block["alt_test"], where)


def _check_audit(block, where) -> None:
    _keys(block, where, "audit", PART_KEYS["audit"])
    for key in ("data", "model"):
        _text(block[key], where, f"audit.{key}")
    _count(block["seed"], where, "audit.seed")
    _count(block["n"], where, "audit.n")
    if not isinstance(block["calibrated"], bool):
        raise _fail(where, "audit.calibrated", "true or false", block["calibrated"])
    for at, entry in _entries(block["figures"], where, "audit.figures", MAX_FIGURES, ("probe", "figure", "estimate")):
        _text(entry["probe"], where, f"{at}.probe")
        _text(entry["figure"], where, f"{at}.figure")
        check_estimate(entry["estimate"], where, f"{at}.estimate", audit_range(entry["figure"]))


def _check_calibration(block, where) -> None:
    _keys(block, where, "calibration", PART_KEYS["calibration"])
    for key in ("data", "split", "model"):
        _text(block[key], where, f"calibration.{key}")
    check_estimate(block["ece"], where, "calibration.ece", RATE)
    _count(block["n"], where, "calibration.n")


def _check_cost(block, where) -> None:
    _keys(block, where, "cost", PART_KEYS["cost"])
    usd = block["usd_per_1000"]
    if not (usd is None or usd == "unpriced" or (finite_number(usd) and 0 <= usd <= 1e9)):
        raise _fail(where, "cost.usd_per_1000", "null, 'unpriced' or dollars from 0 to 1e9", usd)
    calls = block["calls_per_1000"]
    if not (calls is None or (finite_number(calls) and 0 <= calls <= 1e9)):
        raise _fail(where, "cost.calls_per_1000", "null or a number of calls from 0 to 1e9", calls)
    _text(block["source"], where, "cost.source")


CHECKS = {"people": _check_people, "audit": _check_audit, "calibration": _check_calibration, "cost": _check_cost}


def check_certificate(block, where) -> None:
    """A ``ConfigError`` naming ``where`` and the key unless ``block`` is a certificate: ``program`` (a digest) and
    any of ``PARTS``, each by its schema (the module's rules)."""
    if not isinstance(block, dict) or "program" not in block or set(block) - set(CERTIFICATE_KEYS):
        raise ConfigError(f"{where}: key 'certificate' must be a mapping of 'program' and any of {', '.join(PARTS)}"
                          f", got {shown(sorted(map(str, block)) if isinstance(block, dict) else block, 120)}")
    if not isinstance(block["program"], str) or not DIGEST.match(block["program"]):
        raise _fail(where, "program", "the digest of the program it was measured on", block["program"])
    for part in PARTS:
        if part in block:
            CHECKS[part](block[part], where)
