"""How far to trust one verdict: the evidence a run already has, a fixed raw summary of it, and a calibrated map.

``evidence`` reads a verdict's ``Evidence`` alike from a live prediction or a results line; ``raw_confidence`` folds
it into one number that ranks verdicts but is no probability; a ``ConfidenceMap`` fitted on people's labels
(``optim.tuning.confidence``) turns it into the probability that people agree (``agrees``). docs/selective.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, pstdev

import numpy as np

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.program.aggregate import vote
from chateval_dspy.program.task import Scale, TaskSpec, as_task

TOLERANCE = 0.5  # scale points within which an integer-scale verdict agrees with a person's score

# How much each kind of evidence counts in ``raw_confidence`` (a weighted mean over the kinds a verdict has).
# Votes come first: a referee panel split down the middle is the plainest sign of a hard item; order
# consistency next (the paper's position bias); score margins and token probabilities refine those.
WEIGHTS = {"agreement": 0.4, "consistent": 0.3, "margin": 0.2, "spread": 0.2, "token_certainty": 0.1}


@dataclass(frozen=True)
class Evidence:
    """What one verdict rests on; a field is None where the run has no such evidence.

    Attributes:
        agreement: Share of the referee verdicts (every answer order; abstentions count against) that agree
            with the panel's verdict: the same vote (pairwise), the same label or a rating within the tolerance
            (pointwise). 0 when the panel gave no verdict.
        consistent: Pairwise with calibration: both answer orders reached the same preference.
        margin: Pairwise: the referees' mean score margin for the preferred response over the other, each
            criterion divided by its scale's width, in [-1, 1]; for a tie, minus the absolute margin (0 at best).
        spread: Pointwise, integer scales: the referees' standard deviation, divided by half the scale's width
            (the largest it can be), in [0, 1].
        token_certainty: Under ``--weighted-scores``: mean over the rated fields of 1 - |expected - stated|
            (clipped at 0): 1 when the LM put its whole probability on the rating it wrote.
        verdicts: Referee verdicts given (abstentions left out).
    """

    agreement: float
    consistent: bool | None = None
    margin: float | None = None
    spread: float | None = None
    token_certainty: float | None = None
    verdicts: int = 0


def raw_confidence(ev: Evidence) -> float:
    """The weighted mean (``WEIGHTS``) of the evidence a verdict has, in [0, 1]: agreement, consistency (1 or 0),
    the margin (below 0 counts as 0), 1 - spread and token certainty. For a given set of evidence kinds it never
    decreases as agreement, consistency, margin or certainty rise, nor as spread falls. No verdict: 0.

    Example:
        >>> round(raw_confidence(Evidence(agreement=1.0, consistent=True, margin=0.5)), 3)
        0.889
        >>> raw_confidence(Evidence(agreement=0.0))
        0.0
    """
    terms = {"agreement": ev.agreement,
             "consistent": None if ev.consistent is None else float(ev.consistent),
             "margin": None if ev.margin is None else max(0.0, ev.margin),
             "spread": None if ev.spread is None else 1.0 - ev.spread,
             "token_certainty": ev.token_certainty}
    given = {k: v for k, v in terms.items() if v is not None}
    total = sum(WEIGHTS[k] for k in given)
    return min(1.0, max(0.0, sum(WEIGHTS[k] * v for k, v in given.items()) / total))


def agrees(value, human, scale: Scale, tolerance: float = TOLERANCE) -> bool | None:
    """Whether a pointwise verdict ``value`` agrees with a person's ``human`` on ``scale``: the same label, or a
    score within ``tolerance`` points; None when either is missing.

    Example:
        >>> agrees(2.5, 3, Scale(1, 5)), agrees(2.0, 3, Scale(1, 5)), agrees("pass", None, Scale(labels=("pass", "fail")))
        (True, False, None)
    """
    if value is None or human is None:
        return None
    if not scale.ordinal:
        return value == human
    return abs(float(value) - float(human)) <= tolerance


def _rating(verdict: dict, key: str) -> float | None:
    """A referee's rating of ``key``: its expected score under weighted scores, else the integer it wrote."""
    value = (verdict.get("expected") or {}).get(key, verdict.get(key))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def token_certainty(verdicts: Sequence[dict], keys: Sequence[str]) -> float | None:
    """Mean over verdicts and ``keys`` of 1 - |expected - stated| (at least 0); None without expected scores.

    Example:
        >>> token_certainty([{"score_1": 7, "expected": {"score_1": 7.25}}], ["score_1"])
        0.75
    """
    gaps = []
    for v in verdicts:
        expected = v.get("expected") or {}
        for key in keys:
            stated, weighted = v.get(key), expected.get(key)
            if isinstance(stated, (int, float)) and isinstance(weighted, (int, float)):
                gaps.append(max(0.0, 1.0 - abs(float(weighted) - float(stated))))
    return fmean(gaps) if gaps else None


def _given(referees) -> tuple[int, list[dict]]:
    """Every referee verdict slot (all answer orders) and the verdicts given among them."""
    slots = [v for vs in referees.values() for v in (vs if isinstance(vs, list) else [vs])] \
        if isinstance(referees, Mapping) else []
    return len(slots), [v for v in slots if isinstance(v, dict)]


def _margin(verdict: dict, pref: str, task: TaskSpec) -> float | None:
    diffs = []
    for name in task.preference.combine:
        scale = task.criterion[name].scale
        one, two = _rating(verdict, f"{name}_1"), _rating(verdict, f"{name}_2")
        if one is None or two is None:
            return None
        diffs.append((one - two) / (scale.high - scale.low))
    if not diffs:
        return None
    d = fmean(diffs)
    return {"1": d, "2": -d}.get(pref, -abs(d))


def pairwise_evidence(preference: str | None, referees, consistent: bool | None = None,
                      task: TaskSpec | str = "pairwise") -> Evidence:
    """The evidence behind a pairwise ``preference``, from ``referees`` (slug -> that referee's verdicts, one per
    answer order, already un-swapped: a prediction's or a results line's ``referees``) and ``consistent``.

    Example:
        >>> ev = pairwise_evidence("1", {"critic": [{"score_1": 8, "score_2": 4}, {"score_1": 7, "score_2": 7}]}, False)
        >>> ev.agreement, ev.consistent, round(ev.margin, 3)
        (0.5, False, 0.222)
    """
    task = as_task(task)
    slots, given = _given(referees)
    if preference is None:
        return Evidence(agreement=0.0, verdicts=len(given))
    agreeing = sum(vote(v, task) == preference for v in given)
    margins = [m for m in (_margin(v, preference, task) for v in given) if m is not None]
    keys = [f"{name}_{n}" for name in task.preference.combine for n in (1, 2)]
    return Evidence(agreement=agreeing / slots if slots else 0.0, consistent=consistent,
                    margin=fmean(margins) if margins else None,
                    token_certainty=token_certainty(given, keys), verdicts=len(given))


def criterion_evidence(value, referees, criterion: str, task: TaskSpec | str = "pointwise",
                       tolerance: float = TOLERANCE) -> Evidence:
    """The evidence behind a pointwise verdict ``value`` of ``criterion``: referees agreeing (``agrees``), spread.

    Example:
        >>> ev = criterion_evidence(2.5, {"a": [{"naturalness": 2}], "b": [{"naturalness": 3}]}, "naturalness")
        >>> ev.agreement, ev.spread
        (1.0, 0.5)
    """
    task = as_task(task)
    scale = task.scale_of(criterion)
    slots, given = _given(referees)
    if value is None:
        return Evidence(agreement=0.0, verdicts=len(given))
    if not scale.ordinal:
        ratings = [v.get(criterion) for v in given]
        return Evidence(agreement=sum(r == value for r in ratings) / slots if slots else 0.0, verdicts=len(given))
    ratings = [r for r in (_rating(v, criterion) for v in given) if r is not None]
    agreeing = sum(bool(agrees(r, value, scale, tolerance)) for r in ratings)
    spread = min(1.0, pstdev(ratings) / ((scale.high - scale.low) / 2)) if ratings else None
    return Evidence(agreement=agreeing / slots if slots else 0.0, spread=spread,
                    token_certainty=token_certainty(given, [criterion]), verdicts=len(given))


def evidence(verdict, task: TaskSpec | str, tolerance: float = TOLERANCE) -> dict[str, Evidence]:
    """The evidence behind each part of a verdict: ``{"preference": ...}`` (pairwise) or one entry per criterion
    (pointwise). ``verdict`` is a ``ChatEval`` prediction or a results line (its ``prediction`` holds the verdict).

    Example:
        >>> line = {"prediction": "2", "consistent": True, "referees": {"critic": [{"score_1": 3, "score_2": 9}]}}
        >>> evidence(line, "pairwise")["preference"].agreement
        1.0
    """
    task = as_task(task)
    referees = verdict.get("referees") or {}
    if task.format == "pairwise":
        pref = verdict.get("preference") if "preference" in verdict else verdict.get("prediction")
        return {"preference": pairwise_evidence(pref, referees, verdict.get("consistent"), task)}
    values = verdict.get("prediction") if "prediction" in verdict else {c: verdict.get(c) for c in task.output_fields}
    values = values if isinstance(values, Mapping) else {}
    return {c: criterion_evidence(values.get(c), referees, c, task, tolerance) for c in task.output_fields}


@dataclass(frozen=True)
class ConfidenceMap:
    """A fitted, non-decreasing map from ``raw_confidence`` to the probability that people agree with a verdict.

    Linear between breakpoints, the end values beyond them (scikit-learn's isotonic ``out_of_bounds="clip"``).

    Args:
        raw: Breakpoints on the raw confidence, strictly increasing, in [0, 1].
        calibrated: The probability at each breakpoint, non-decreasing, in [0, 1].
        method: ``isotonic`` or ``platt`` (a logistic curve, tabulated); ``n``: labelled verdicts it was fitted on.

    Example:
        >>> cmap = ConfidenceMap(raw=(0.2, 0.8), calibrated=(0.5, 0.9), method="isotonic", n=40)
        >>> cmap(0.0), round(cmap(0.5), 3), cmap(1.0)
        (0.5, 0.7, 0.9)
    """

    raw: tuple[float, ...]
    calibrated: tuple[float, ...]
    method: str = "isotonic"
    n: int = 0

    def __post_init__(self) -> None:
        check_map(self.to_dict(), "a confidence map")

    def __call__(self, raw: float) -> float:
        return float(np.interp(raw, self.raw, self.calibrated))

    def to_dict(self) -> dict:
        return {"method": self.method, "n": self.n, "raw": list(self.raw), "calibrated": list(self.calibrated)}

    @classmethod
    def from_dict(cls, data, source: str) -> ConfidenceMap:
        """A map from untrusted ``data`` (a saved program, a card), checked.

        Example:
            >>> ConfidenceMap.from_dict({"method": "isotonic", "n": 9, "raw": [0.1, 0.5], "calibrated": [0.6, 0.4]},
            ...                         "program.json")
            Traceback (most recent call last):
            ...
            chateval_dspy.errors.ConfigError: program.json: confidence map field 'calibrated': must not decrease ...
        """
        check_map(data, source)
        return cls(raw=tuple(float(x) for x in data["raw"]), calibrated=tuple(float(x) for x in data["calibrated"]),
                   method=data["method"], n=data["n"])


METHODS = ("isotonic", "platt")


def _refuser(source: str, what: str):
    def refuse(field: str, problem: str):
        raise ConfigError(f"{source}: {what} field '{field}': {problem}")

    return refuse


def check_map(data, source: str) -> None:
    """A ``ConfigError`` naming ``source`` and the field unless ``data`` is a valid ``ConfidenceMap.to_dict()``."""
    refuse = _refuser(source, "confidence map")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a confidence map is a mapping, got {shown(data, 60)}")
    if set(data) != {"method", "n", "raw", "calibrated"}:
        raise ConfigError(f"{source}: a confidence map has the fields method, n, raw and calibrated; "
                          f"got {sorted(map(str, data))[:10]}")
    if data["method"] not in METHODS:
        refuse("method", f"choose one of {', '.join(METHODS)}, got {shown(data['method'], 40)}")
    if isinstance(data["n"], bool) or not isinstance(data["n"], int) or data["n"] < 0:
        refuse("n", f"must be a count of labelled verdicts, got {shown(data['n'], 40)}")
    for field in ("raw", "calibrated"):
        values = data[field]
        if not isinstance(values, (list, tuple)) or not 1 <= len(values) <= limits.MAX_CONFIDENCE_BREAKPOINTS:
            refuse(field, f"must be a list of 1 to {limits.MAX_CONFIDENCE_BREAKPOINTS} numbers "
                          f"(limits.MAX_CONFIDENCE_BREAKPOINTS), got {shown(values, 60)}")
        for x in values:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 1:  # NaN fails the range
                refuse(field, f"every value must be a number in [0, 1], got {shown(x, 40)}")
    raw, calibrated = data["raw"], data["calibrated"]
    if len(raw) != len(calibrated):
        refuse("calibrated", f"must have one value per breakpoint ({len(raw)}), got {len(calibrated)}")
    if any(b <= a for a, b in zip(raw, raw[1:])):
        refuse("raw", "breakpoints must be strictly increasing")
    if any(b < a for a, b in zip(calibrated, calibrated[1:])):
        refuse("calibrated", "must not decrease (a higher raw confidence never means less agreement)")


NEEDS_PERSON = "needs_person"  # the abstention of a verdict whose calibrated confidence is below the threshold
# ``Calibration.fitted_on``: what the map and threshold were fitted on, in a few short words and numbers.
MAX_FITTED_ON_KEYS, MAX_FITTED_ON_CHARS = 10, 200


@dataclass(frozen=True)
class Calibration:
    """A saved evaluator's calibrated confidence and, optionally, the threshold a verdict's confidence must reach
    for the verdict to be given (``calibration.json`` beside ``program.json``; ``chateval calibrate`` writes it).

    Attributes:
        threshold: Below it a verdict is withheld (``NEEDS_PERSON``); None: every verdict is given.
        level: The agreement with people guaranteed for the verdicts given (with ``threshold``).
        risk: The accepted chance that the guarantee fails (with ``threshold``).
        fitted_on: What it was fitted on (``data``, ``split``, ``n``, ``model``, ``seed``): short strings and ints.

    Example:
        >>> cal = Calibration(ConfidenceMap(raw=(0.2, 0.8), calibrated=(0.5, 0.9), n=40), threshold=0.8, level=0.85,
        ...                   risk=0.1, fitted_on={"data": "faireval", "split": "calibration", "n": 40})
        >>> round(cal.confidence(0.5), 3), cal.gives(0.7), cal.gives(0.85)
        (0.7, False, True)
        >>> Calibration.from_dict(cal.to_dict(), "calibration.json") == cal
        True
    """

    map: ConfidenceMap
    threshold: float | None = None
    level: float | None = None
    risk: float | None = None
    fitted_on: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_calibration({**self.to_dict(), "map": self.map.to_dict()}, "a calibration")

    def confidence(self, raw: float) -> float:
        return self.map(raw)

    def gives(self, confidence: float | None) -> bool:
        """Whether a verdict of calibrated ``confidence`` is given; with a threshold, one without a confidence is not."""
        if self.threshold is None:
            return True
        return confidence is not None and confidence >= self.threshold

    def to_dict(self) -> dict:
        return {"map": self.map.to_dict(), "threshold": self.threshold, "level": self.level, "risk": self.risk,
                "fitted_on": dict(self.fitted_on)}

    @classmethod
    def from_dict(cls, data, source: str) -> Calibration:
        """A calibration from untrusted ``data`` (a parsed ``calibration.json``), checked.

        Example:
            >>> good = {"map": {"method": "isotonic", "n": 9, "raw": [0.1, 0.5], "calibrated": [0.4, 0.6]},
            ...         "threshold": None, "level": None, "risk": None, "fitted_on": {}}
            >>> Calibration.from_dict({**good, "threshold": 2.0}, "calibration.json")
            Traceback (most recent call last):
            ...
            chateval_dspy.errors.ConfigError: calibration.json: calibration field 'threshold': must be a number in [0, 1] ...
        """
        check_calibration(data, source)
        return cls(map=ConfidenceMap.from_dict(data["map"], source), threshold=data["threshold"],
                   level=data["level"], risk=data["risk"], fitted_on=dict(data["fitted_on"]))


CALIBRATION_FIELDS = ("map", "threshold", "level", "risk", "fitted_on")


def check_calibration(data, source: str) -> None:
    """A ``ConfigError`` naming ``source`` and the field unless ``data`` is a valid ``Calibration.to_dict()``."""
    if not isinstance(data, Mapping) or set(data) != set(CALIBRATION_FIELDS):
        got = sorted(map(str, data))[:10] if isinstance(data, Mapping) else shown(data, 60)
        raise ConfigError(f"{source}: a calibration is a mapping of exactly {', '.join(CALIBRATION_FIELDS)}; got {got}")
    check_map(data["map"], source)
    check_guarantee(data, source)


def check_guarantee(data: Mapping, source: str) -> None:
    """The checks of a calibration's ``threshold``, ``level``, ``risk`` and ``fitted_on`` (present in ``data``),
    shared with the summary a judge card holds."""
    refuse = _refuser(source, "calibration")
    for name in ("threshold", "level", "risk"):
        x = data[name]
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 1):
            refuse(name, f"must be a number in [0, 1] or null, got {shown(x, 40)}")
    if (data["threshold"] is None) != (data["level"] is None) or (data["threshold"] is None) != (data["risk"] is None):
        refuse("threshold", "threshold, level and risk are given together (the level is what the threshold "
                            "guarantees at that risk), or all null")
    fitted = data["fitted_on"]
    if not isinstance(fitted, Mapping) or len(fitted) > MAX_FITTED_ON_KEYS:
        refuse("fitted_on", f"must be a mapping of at most {MAX_FITTED_ON_KEYS} entries, got {shown(fitted, 60)}")
    for key, value in fitted.items():
        if not isinstance(key, str) or not 0 < len(key) <= 40 or not key.isprintable():
            refuse("fitted_on", f"keys must be short printable names, got {shown(key, 40)}")
        short = isinstance(value, str) and len(value) <= MAX_FITTED_ON_CHARS and value.isprintable()
        whole = isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63
        if not (short or whole or value is None):
            refuse(f"fitted_on.{key}", f"must be a printable text of at most {MAX_FITTED_ON_CHARS} characters, a "
                                       f"whole number or null, got {shown(value, 40)}")


def line_confidence(line: Mapping, task: TaskSpec | str, tolerance: float = TOLERANCE) -> float | dict | None:
    """The raw confidence of a results line's verdict (``line["prediction"]``): one figure (pairwise), or one per
    criterion that has a value (pointwise); None without a verdict.

    Example:
        >>> round(line_confidence({"prediction": "2", "consistent": True,
        ...                        "referees": {"a": [{"score_1": 3, "score_2": 9}]}}, "pairwise"), 3)
        0.926
    """
    task = as_task(task)
    verdict = line.get("prediction")
    if verdict is None:
        return None
    found = evidence(line, task, tolerance)
    if task.format == "pairwise":
        return raw_confidence(found["preference"])
    return {c: raw_confidence(ev) for c, ev in found.items() if isinstance(verdict, Mapping) and verdict.get(c) is not None}


def calibrated(raw: float | dict | None, calibration: Calibration | None) -> float | dict | None:
    """``raw`` (a figure, or one per criterion) through ``calibration``'s map; as it is without a calibration."""
    if raw is None or calibration is None:
        return raw
    if isinstance(raw, Mapping):
        return {c: calibration.confidence(r) for c, r in raw.items()}
    return calibration.confidence(raw)


def lowest(confidence: float | dict | None) -> float | None:
    """The figure a verdict is given or withheld by: its confidence, or (pointwise) its least confident criterion's,
    so that a verdict is given whole or not at all; None without one.

    Example:
        >>> lowest({"coherence": 0.9, "naturalness": 0.6}), lowest(0.7), lowest({})
        (0.6, 0.7, None)
    """
    if isinstance(confidence, Mapping):
        return min(confidence.values()) if confidence else None
    return confidence
