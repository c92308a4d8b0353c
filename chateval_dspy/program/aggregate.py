"""Pure reductions from referees' verdicts to the panel's verdict."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from statistics import fmean


def preference(score_1: float, score_2: float) -> str:
    """``"1"``, ``"2"`` or ``"tie"`` from two scores.

    Example:
        >>> preference(7, 7.0)
        'tie'
    """
    if score_1 > score_2:
        return "1"
    if score_2 > score_1:
        return "2"
    return "tie"


def majority(votes: Iterable[str | None]) -> str | None:
    """The most common vote; an even split between the leaders is a tie; no votes is None.

    Abstentions (None) do not vote.

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


def vote(verdict: dict | None) -> str | None:
    """A referee's vote: its stated preference, or (for verdicts without one) what its scores imply."""
    if verdict is None:
        return None
    return verdict.get("preference") or preference(verdict["score_1"], verdict["score_2"])


def _score(verdict: dict, key: str) -> float:
    # A G-Eval expected score, where the LM gave one, stands in for the integer rating.
    return verdict.get("expected", {}).get(key, verdict[key])


def mean_scores(verdicts: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """Per-score mean over the verdicts that were given (abstentions skipped); None if none were.

    Example:
        >>> mean_scores([{"score_1": 8, "score_2": 4}, None, {"score_1": 6, "score_2": 6}])
        {'score_1': 7.0, 'score_2': 5.0}
    """
    given = [v for v in verdicts if v is not None]
    if not given:
        return None
    return {key: fmean(_score(v, key) for v in given) for key in _numeric(given[0])}


def mode_scores(verdicts: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """Per-key most common score; when several are equally common, their mean."""
    given = [v for v in verdicts if v is not None]
    if not given:
        return None
    out = {}
    for key in _numeric(given[0]):
        counts = Counter(v[key] for v in given).most_common()
        top = [value for value, n in counts if n == counts[0][1]]
        out[key] = fmean(top)
    return out


def pairwise_verdict(verdicts: Sequence[dict[str, int] | None], how: str) -> tuple[str | None, dict | None]:
    """The panel's preference and mean scores from referees' verdicts.

    ``how="mean"`` compares the mean ``score_1``/``score_2`` (the paper); ``how="majority"`` counts each
    referee's vote (its stated ``preference``).
    """
    means = mean_scores(verdicts)
    if how == "majority":
        return majority(vote(v) for v in verdicts), means
    return (preference(means["score_1"], means["score_2"]) if means else None), means


def scoring_verdict(verdicts: Sequence[dict[str, int] | None], how: str) -> dict[str, float] | None:
    """Per-aspect panel scores: the mean (the paper) or the most common rating."""
    return mode_scores(verdicts) if how == "majority" else mean_scores(verdicts)
