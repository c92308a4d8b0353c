"""How unsure the panel was about one judged item: a stated score from what its results record already holds.

Five components, each in [0, 1], from one results record (a line of ``chateval evaluate``/``score``, or the same
fields read back from a trace by ``optim.review.sources``)::

    U = 0.30 * split + 0.25 * inconsistent + 0.20 * margin + 0.15 * abstained + 0.10 * spread

- ``split``: the referees disagree. Pairwise: per answer order, the referees' votes (a stated preference, or
  what a referee's scores imply) give ``(1 - top / n) / (1 - 1 / min(n, 3))``, with ``top`` the largest number of
  equal votes among ``n``: 0 when all agree, 1 when the votes are spread as far as they can be; the mean over
  the orders with at least two votes. Pointwise: per criterion, the range of the referees' ratings over the
  scale's range (integer scales) or the same vote formula over its ``k`` labels (``min(n, k)``); the mean over
  criteria.
- ``inconsistent``: 1 when the two answer orders reached different verdicts (``consistent: false``), else 0.
- ``margin``: the panel's verdict is narrow. Pairwise: ``1 - |s1 - s2| / (high - low)`` of the panel's mean
  scores, averaged over the criteria the preference combines (a tie on equal scores is 1). Pointwise: on each
  integer-scale criterion, ``2 * |x - round(x)|`` of the panel's score ``x`` (1 halfway between two points),
  averaged over those criteria; label-scale criteria have no margin.
- ``abstained``: the share of the referees' verdicts (per referee and order) that are missing; 1 when the
  whole panel abstained.
- ``spread`` (results of ``--weighted-scores``): how far a verdict's expected score under the LM's token
  probabilities lies from the rating it stated, ``min(1, 2 * mean |E - s|)`` over the weighted fields: half a
  point away is a coin flip between two neighbouring ratings. 0 without weighted scores.

The weights put disagreement among the referees first and position bias second, because both say that the
panel's own evidence conflicts; margin, abstentions and token probabilities say only that it is weak.
Components that do not apply (no second order, no weighted scores) are 0, so U is comparable within a run.

A calibrated verdict confidence (``confidence`` with ``confidence_calibrated`` true: the probability that people
agree, from ``chateval calibrate``'s map) ranks its line instead of ``U``, lowest first; a raw one is shown but does
not rank (it is no probability, and ``U`` weighs the same evidence). Items withheld for a person (``withheld_of``)
come first, as they have no verdict at all, then lines by confidence, then lines by ``U`` (not one scale).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import fmean

from chateval_dspy.program.aggregate import vote
from chateval_dspy.program.confidence import NEEDS_PERSON
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.run.records import is_error

WEIGHTS = {"split": 0.30, "inconsistent": 0.25, "margin": 0.20, "abstained": 0.15, "spread": 0.10}


@dataclass(frozen=True)
class Uncertainty:
    """One item's uncertainty: the score ``U``, each component's value, and a reason for each non-zero one."""

    item_id: str
    score: float
    components: dict[str, float] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    confidence: float | None = None  # the line's verdict confidence (``confidence_of``), which ranks it when given
    calibrated: bool = False
    withheld: bool = False  # no verdict: withheld for a person (``withheld_of``)

    def explain(self) -> str:
        """One line: the confidence or the score, then the reasons (what ``chateval review --explain`` prints)."""
        head = "withheld: needs a person; " if self.withheld else ""
        if self.confidence is not None:
            head += f"confidence={self.confidence:.3f} ({'calibrated' if self.calibrated else 'raw'}), "
        return f"{self.item_id}: {head}U={self.score:.3f}  " + ("; ".join(self.reasons) or "the panel was sure")


def withheld_of(record: dict) -> bool:
    """Whether the line's verdict was withheld for a person (its confidence fell below the threshold): the line
    keeps the panel's verdict as ``withheld`` and abstains with ``needs_person``.

    Example:
        >>> withheld_of({"withheld": "2"}), withheld_of({"abstained": "needs_person"}), withheld_of({"abstained": None})
        (True, True, False)
    """
    return record.get("withheld") is not None or record.get("abstained") == NEEDS_PERSON


def confidence_of(record: dict) -> float | None:
    """The line's verdict confidence: a number in [0, 1], or per criterion the lowest (the part people most
    likely disagree with); None when the line has none or it is not such a number (read from a file: untrusted).

    Example:
        >>> confidence_of({"confidence": 0.7}), confidence_of({"confidence": {"a": 0.9, "b": 0.4}}), confidence_of({})
        (0.7, 0.4, None)
    """
    value = record.get("confidence")
    values = list(value.values()) if isinstance(value, dict) else [value]
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v) and 0.0 <= v <= 1.0]
    return min(numbers) if numbers and len(numbers) == len(values) else None


def _task(record: dict, task) -> TaskSpec:
    return as_task(task or record.get("format") or "pairwise")


def _disagreement(votes: list, kinds: int) -> float:
    """``(1 - top / n) / (1 - 1 / min(n, kinds))``: 0 when all votes agree, 1 at the widest possible spread.

    Example:
        >>> _disagreement(["1", "1"], 3), _disagreement(["1", "2"], 3), round(_disagreement(["1", "1", "2"], 3), 3)
        (0.0, 1.0, 0.5)
    """
    n = len(votes)
    most = min(n, kinds)
    if n < 2 or most < 2:
        return 0.0
    top = Counter(map(str, votes)).most_common(1)[0][1]
    return (1 - top / n) / (1 - 1 / most)


def _orders(record: dict) -> list[list[tuple[str, dict | None]]]:
    """The referees' verdicts per answer order: ``[[(slug, verdict or None), ...], ...]``."""
    referees = record.get("referees") or {}
    n = max((len(v) for v in referees.values()), default=0)
    return [[(slug, v[o] if o < len(v) else None) for slug, v in referees.items()] for o in range(n)]


def split(record: dict, task=None) -> tuple[float, str | None]:
    """How far the referees disagree (see the module docstring); returns the value and its reason.

    Example:
        >>> record = {"format": "pairwise", "referees": {"critic": [{"score_1": 8, "score_2": 3}, None],
        ...                                              "scientist": [{"score_1": 2, "score_2": 6}, None]}}
        >>> split(record)
        (1.0, 'referees split (order 1: critic 1, scientist 2)')
    """
    task = _task(record, task)
    orders = _orders(record)
    found = []  # (value, what was said) per order (pairwise) or criterion (pointwise) with two or more verdicts
    if task.format == "pairwise":
        for o, verdicts in enumerate(orders, start=1):
            votes = [(slug, vote(v, task)) for slug, v in verdicts if v is not None]
            if len(votes) >= 2:
                found.append((_disagreement([b for _, b in votes], 3),
                              f"order {o}: " + ", ".join(f"{slug} {b}" for slug, b in votes)))
    else:
        given = [v for verdicts in orders for _, v in verdicts if v is not None]
        for criterion in task.criteria:
            ratings = [v[criterion.name] for v in given if v.get(criterion.name) is not None]
            scale = criterion.scale
            if len(ratings) >= 2:
                found.append(((max(ratings) - min(ratings)) / (scale.high - scale.low) if scale.ordinal
                              else _disagreement(ratings, len(scale.labels)), f"{criterion.name} {'/'.join(map(str, ratings))}"))
    said = ("; " if task.format == "pairwise" else ", ").join(text for value, text in found if value > 0)
    return fmean([v for v, _ in found]) if found else 0.0, (f"referees split ({said})" if said else None)


def inconsistent(record: dict, task=None) -> tuple[float, str | None]:
    """1 when the two answer orders reached different verdicts, else 0.

    Example:
        >>> inconsistent({"consistent": False, "order_preferences": ["1", "tie"]})
        (1.0, 'answer orders disagree (1 then tie)')
    """
    if record.get("consistent") is not False:
        return 0.0, None
    prefs = record.get("order_preferences") or []
    return 1.0, "answer orders disagree" + (f" ({' then '.join(map(str, prefs))})" if prefs else "")


def margin(record: dict, task=None) -> tuple[float, str | None]:
    """How narrow the panel's verdict is (see the module docstring).

    Example:
        >>> margin({"format": "pairwise", "score_1": 6.0, "score_2": 5.0})
        (0.889, 'narrow margin (score 6 vs 5 on 1-10)')
    """
    task = _task(record, task)
    found = []  # (value, what was said) per integer-scale criterion with the scores it needs
    if task.format == "pairwise":
        for name in task.preference.combine:
            scale = task.criterion[name].scale
            s1, s2 = record.get(f"{name}_1"), record.get(f"{name}_2")
            if scale.ordinal and isinstance(s1, (int, float)) and isinstance(s2, (int, float)):
                found.append((1 - min(1.0, abs(s1 - s2) / (scale.high - scale.low)), f"{name} {s1:g} vs {s2:g} on {scale}"))
        value = round(fmean(v for v, _ in found), 3) if found else 0.0
        return value, (f"narrow margin ({', '.join(text for _, text in found)})" if value > 0 else None)
    verdict = record.get("withheld") if withheld_of(record) else record.get("prediction")  # withheld: the panel's
    scores = verdict if isinstance(verdict, dict) else {}
    for criterion in task.criteria:
        x = scores.get(criterion.name)
        if criterion.scale.ordinal and isinstance(x, (int, float)) and not isinstance(x, bool):
            found.append((2 * abs(x - round(x)), f"{criterion.name} {x:.2f}"))
    said = ", ".join(text for value, text in found if value > 0)
    return (round(fmean(v for v, _ in found), 3) if found else 0.0), (f"between two points ({said})" if said else None)


def abstained(record: dict, task=None) -> tuple[float, str | None]:
    """The share of referees' verdicts that are missing; 1 when the whole panel abstained. A verdict withheld for
    a person (``withheld_of``) is no abstention of the panel: the panel reached it, and only its referees' missing
    verdicts count.

    Example:
        >>> abstained({"referees": {"critic": [None, {"score_1": 1, "score_2": 2}], "scientist": [None, None]},
        ...            "abstentions": {"order1:critic@2": "parse_failure"}})
        (0.75, '3 of 4 verdicts missing (parse_failure)')
        >>> abstained({"abstained": "needs_person", "withheld": "2", "referees": {"critic": [{"score_1": 1, "score_2": 2}]}})
        (0.0, None)
    """
    reasons = sorted(set((record.get("abstentions") or {}).values()))
    why = f" ({', '.join(reasons)})" if reasons else ""
    if record.get("abstained") and not withheld_of(record):
        return 1.0, f"the panel abstained ({record['abstained']})"
    verdicts = [v for verdicts in _orders(record) for _, v in verdicts]
    missing = sum(v is None for v in verdicts)
    if not verdicts or not missing:
        return 0.0, None
    return missing / len(verdicts), f"{missing} of {len(verdicts)} verdicts missing{why}"


def spread(record: dict, task=None) -> tuple[float, str | None]:
    """How spread the verdicts' token probabilities are (``--weighted-scores``): ``min(1, 2 * mean |E - s|)``.

    Example:
        >>> spread({"referees": {"critic": [{"score_1": 7, "score_2": 3, "expected": {"score_1": 7.3, "score_2": 3.1}}]}})
        (0.4, 'probabilities spread (expected scores 0.2 from the stated ones on average)')
    """
    expected = [(v[name], e) for verdicts in _orders(record) for _, v in verdicts
                for name, e in ((v or {}).get("expected") or {}).items() if name in v]
    gaps = [abs(e - s) for s, e in expected if isinstance(s, (int, float)) and isinstance(e, (int, float))]
    if not gaps:
        return 0.0, None
    gap = fmean(gaps)
    value = round(min(1.0, 2 * gap), 3)
    return value, (f"probabilities spread (expected scores {gap:.1f} from the stated ones on average)"
                   if value > 0 else None)


COMPONENTS = {"split": split, "inconsistent": inconsistent, "margin": margin, "abstained": abstained,
              "spread": spread}


def uncertainty(record: dict, task=None) -> Uncertainty:
    """The item's ``U`` and its components (see the module docstring) from a results record (a line of a results
    file, or ``sources.record_from_trace``); ``task`` (a spec or format name) defaults to the record's format's.

    Example:
        >>> u = uncertainty({"id": "7", "format": "pairwise", "consistent": False, "order_preferences": ["1", "2"],
        ...                  "score_1": 5.0, "score_2": 5.0, "referees": {"critic": [{"score_1": 5, "score_2": 5}] * 2}})
        >>> u.score, u.components["inconsistent"], u.components["margin"]
        (0.45, 1.0, 1.0)
    """
    task = _task(record, task)
    found = {name: component(record, task) for name, component in COMPONENTS.items()}
    components = {name: float(value) for name, (value, _) in found.items()}
    score = round(sum(WEIGHTS[k] * v for k, v in components.items()), 6)
    reasons = tuple(reason for _, reason in found.values() if reason)
    return Uncertainty(str(record.get("id")), score, components, reasons, confidence=confidence_of(record),
                       calibrated=record.get("confidence_calibrated") is True, withheld=withheld_of(record))


def tie_break(item_id) -> str:
    """Where an item goes among equal scores: a hash of its id, fixed but unrelated to the file's order.

    A file sorted by category (FairEval's is) would otherwise spend a label budget on one category, and labels from
    one category teach the panel only that one (``python -m optim.bench review --planted`` measured it).
    """
    return hashlib.sha256(str(item_id).encode("utf-8")).hexdigest()


def _order(u: Uncertainty) -> tuple:
    if u.confidence is not None and u.calibrated:
        return (not u.withheld, 0, u.confidence, tie_break(u.item_id))
    return (not u.withheld, 1, -u.score, tie_break(u.item_id))


def rank(records: Iterable[dict], task=None) -> list[tuple[dict, Uncertainty]]:
    """Judged records (error lines left out), most in need of a person first (see the module docstring); equal
    scores in ``tie_break`` order.

    Example:
        >>> ranked = rank([{"id": "a", "format": "pairwise"}, {"id": "b", "format": "pairwise", "consistent": False}])
        >>> [u.item_id for _, u in ranked]
        ['b', 'a']
        >>> calibrated = {"confidence_calibrated": True}
        >>> ranked = rank([{"id": "c", "confidence": 0.9, **calibrated}, {"id": "d", "confidence": 0.6, **calibrated},
        ...                {"id": "e", "confidence": 0.3, "withheld": "1", "abstained": "needs_person", **calibrated}])
        >>> [u.item_id for _, u in ranked]
        ['e', 'd', 'c']
    """
    scored = [(r, uncertainty(r, task)) for r in records if not is_error(r)]
    return sorted(scored, key=lambda pair: _order(pair[1]))
