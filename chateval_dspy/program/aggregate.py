"""Pure reductions from referees' verdicts to the panel's verdict, following the task's scales.

Integer-scale fields are averaged (``mean``, the paper) or take their most common rating
(``majority``); label-scale fields take their most common label. A pairwise panel compares the
responses' mean scores over the task's ``preference.combine`` criteria, or counts each referee's vote.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from statistics import fmean

from chateval_dspy.program.task import TaskSpec, as_task


def preference(score_1: float, score_2: float) -> str:
    """``"1"``, ``"2"`` or ``"tie"`` from two scores.

    Example:
        >>> preference(7, 7.0)
        'tie'
    """
    return "1" if score_1 > score_2 else "2" if score_2 > score_1 else "tie"


def majority(votes: Iterable[str | None]) -> str | None:
    """The most common vote; an even split between the leaders is a tie; no votes is None (abstentions don't vote).

    Example:
        >>> majority(["1", "2"]), majority(["1", "1", "tie"]), majority([None])
        ('tie', '1', None)
    """
    counts = Counter(v for v in votes if v is not None).most_common()
    if not counts:
        return None
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return "tie"
    return counts[0][0]


def _numeric(verdict: dict) -> list[str]:
    return [k for k, v in verdict.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]


def combined(verdict: dict, n: int, task: TaskSpec | str = "pairwise") -> float:
    """Response ``n``'s score in a pairwise verdict: its mean over the task's ``preference.combine`` criteria.

    Example:
        >>> combined({"score_1": 8, "score_2": 3}, 1)
        8.0
    """
    return fmean(verdict[f"{name}_{n}"] for name in as_task(task).preference.combine)


def vote(verdict: dict | None, task: TaskSpec | str = "pairwise") -> str | None:
    """A referee's vote: its stated preference, or (for verdicts without one) what its scores imply."""
    if verdict is None:
        return None
    return verdict.get("preference") or preference(combined(verdict, 1, task), combined(verdict, 2, task))


def mean_scores(verdicts: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """Per-score mean over the verdicts that were given (abstentions skipped); None if none were.

    Example:
        >>> mean_scores([{"score_1": 8, "score_2": 4}, None, {"score_1": 6, "score_2": 6}])
        {'score_1': 7.0, 'score_2': 5.0}
    """
    given = [v for v in verdicts if v is not None]
    if not given:
        return None
    # A G-Eval expected score, where the LM gave one, stands in for the integer rating.
    return {key: fmean(v.get("expected", {}).get(key, v[key]) for v in given) for key in _numeric(given[0])}


def mode_scores(verdicts: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """Per-key most common score; when several are equally common, their mean."""
    given = [v for v in verdicts if v is not None]
    if not given:
        return None

    def mode(key: str) -> float:
        counts = Counter(v[key] for v in given).most_common()
        return fmean(value for value, n in counts if n == counts[0][1])

    return {key: mode(key) for key in _numeric(given[0])}


def majority_label(values: Iterable[str], order: Sequence[str]) -> str:
    """The most common label; among equally common ones, the one listed first on the scale.

    Example:
        >>> majority_label(["fail", "pass"], ("pass", "fail")), majority_label(["fail", "fail", "pass"], ("pass", "fail"))
        ('pass', 'fail')
    """
    counts = Counter(values)
    top = max(counts.values())
    return next(label for label in order if counts.get(label) == top)


def panel_scores(verdicts: Sequence[dict | None], how: str, task: TaskSpec | str) -> dict | None:
    """Each verdict field's panel value (abstentions skipped; None if every referee abstained); ``how="mean"``
    averages integer scales with weighted scores where given.

    Example:
        >>> panel_scores([{"naturalness": 3, "coherence": 2, "engagingness": 1, "groundedness": 1}, None,
        ...               {"naturalness": 2, "coherence": 2, "engagingness": 2, "groundedness": 0}], "mean", "pointwise")
        {'naturalness': 2.5, 'coherence': 2.0, 'engagingness': 1.5, 'groundedness': 0.5}
    """
    task = as_task(task)
    given = [v for v in verdicts if v is not None]
    if not given:
        return None
    names = [f for f in task.output_fields if f in given[0]]  # a verdict checked by check_verdict has them all
    ordinal = (mode_scores if how == "majority" else mean_scores)(
        [{f: v[f] for f in names if task.scale_of(f).ordinal} | ({"expected": v["expected"]} if "expected" in v else {})
         for v in given])
    out = {}
    for name in names:
        scale = task.scale_of(name)
        out[name] = ordinal[name] if scale.ordinal else majority_label((v[name] for v in given), scale.labels)
    return out


def pairwise_verdict(verdicts: Sequence[dict | None], how: str,
                     task: TaskSpec | str = "pairwise") -> tuple[str | None, dict | None]:
    """The panel's preference (``how``: the module's rule) and per-field mean panel scores from referees' verdicts.

    Example:
        >>> pairwise_verdict([{"score_1": 8, "score_2": 4}, {"score_1": 5, "score_2": 6}], "mean")
        ('1', {'score_1': 6.5, 'score_2': 5.0})
    """
    task = as_task(task)
    means = panel_scores(verdicts, "mean", task)  # the scores reported beside either kind of preference
    if how == "majority":
        return majority(vote(v, task) for v in verdicts), means
    if means is None:
        return None, None
    return preference(combined(means, 1, task), combined(means, 2, task)), means


def pointwise_verdict(verdicts: Sequence[dict | None], how: str, task: TaskSpec | str = "pointwise") -> dict | None:
    """Per-criterion panel scores of one response: the mean (the paper) or the most common rating; labels by majority."""
    return panel_scores(verdicts, how, task)
