"""How far a queue's reviewers agree, for the queue's owner: Krippendorff's alpha per question, with its counts (why
alpha and not a kappa: docs/review.md).

A label question is measured as nominal (any two different labels disagree fully), an integer scale as interval (a
disagreement counts as the squared distance). Answers of "can't judge" are no value: they are counted apart. Only
items with at least two answers are pairable; with fewer than two such items, or when every answer is the same value
(no expected disagreement), alpha is undefined (None).

Formula (Krippendorff 2011, "Computing Krippendorff's alpha-reliability"): with ``n`` pairable values in all and
``m_u`` values in item ``u``, the observed disagreement ``D_o = 1/n * sum_u sum_{i != j in u} d(v_i, v_j) / (m_u -
1)`` and the expected ``D_e = 1/(n (n - 1)) * sum_{i != j} d(v_i, v_j)`` over all pairable values; ``alpha = 1 -
D_o / D_e``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import combinations


@dataclass(frozen=True)
class Agreement:
    """One question's agreement: alpha (None: undefined) and what it rests on."""

    question: str
    metric: str  # nominal or interval
    alpha: float | None
    items: int  # items with at least two answers (the pairable ones)
    values: int  # answers in those items
    reviewers: int  # reviewers who answered any item of the question
    cant_judge: int  # "can't judge" answers, left out


def alpha(units: list[list], metric: str = "nominal") -> float | None:
    """Krippendorff's alpha of ``units`` (each item's values; items with fewer than two are left out).

    Example (Krippendorff 2011's example: 4 reviewers, 12 items, some answers missing):
        >>> data = [[1, 1, 1], [2, 2, 3, 2], [3, 3, 3, 3], [3, 3, 3, 3], [2, 2, 2, 2], [1, 2, 3, 4], [4, 4, 4, 4],
        ...         [1, 1, 2, 1], [2, 2, 2, 2], [5, 5, 5], [1, 1], [3]]
        >>> round(alpha(data, "nominal"), 3), round(alpha(data, "interval"), 3)
        (0.743, 0.849)
    """
    d = (lambda a, b: (float(a) - float(b)) ** 2) if metric == "interval" else (lambda a, b: float(str(a) != str(b)))
    pairable = [u for u in units if len(u) >= 2]
    n = sum(len(u) for u in pairable)
    if len(pairable) < 2 or n < 2:
        return None
    observed = sum(2 * d(a, b) / (len(u) - 1) for u in pairable for a, b in combinations(u, 2)) / n
    counts = Counter(str(v) if metric == "nominal" else float(v) for u in pairable for v in u)
    expected = sum(2 * d(a, b) * ca * cb for (a, ca), (b, cb) in combinations(counts.items(), 2)) / (n * (n - 1))
    if expected == 0:
        return None
    return 1 - observed / expected


def agreement(answers: dict[str, dict[str, dict[str, object]]], questions, cant_judge: object) -> list[Agreement]:
    """Each question's agreement from ``{item: {question: {reviewer: value}}}`` (``cant_judge`` values apart).

    Example:
        >>> from optim.review.questions import Question
        >>> asked = [Question("preference", "", options=("1", "2", "tie"))]
        >>> got = agreement({"a": {"preference": {"ann": "1", "bo": "1"}}, "b": {"preference": {"ann": "2", "bo": "2"}},
        ...                  "c": {"preference": {"ann": "?", "bo": "tie"}}}, asked, "?")
        >>> got[0].alpha, got[0].items, got[0].values, got[0].reviewers, got[0].cant_judge
        (1.0, 2, 4, 2, 1)
    """
    out = []
    for q in questions:
        by_item = [a.get(q.name, {}) for a in answers.values()]
        units = [[v for v in by.values() if v != cant_judge] for by in by_item]
        who = {r for by in by_item for r, v in by.items() if v != cant_judge}
        skipped = sum(v == cant_judge for by in by_item for v in by.values())
        metric = "nominal" if q.options else "interval"
        pairable = [u for u in units if len(u) >= 2]
        out.append(Agreement(q.name, metric, alpha(units, metric), len(pairable), sum(map(len, pairable)),
                             len(who), skipped))
    return out
