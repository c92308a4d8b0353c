"""The alternative annotator test: can the panel stand in for one of the people on this data?

As published (Calderon, Reichart and Dror, ACL 2025, arXiv 2501.10970; reference code github.com/nitaytech/AltTest);
what it measures and how to read it: docs/selective.md. ``W_f`` is 1 when the judge's alignment with the other people
is >= the left-out person's, ``W_h`` the reverse (a tie counts for both). Per person, the one-sided paired t-test of
``H0: mean(W_h - W_f) >= epsilon``, Benjamini-Yekutieli at ``q`` over the people; ``omega`` is the share rejected,
``rho`` the mean over people of ``mean(W_f)``; the judge "can replace an annotator" when ``omega >= 0.5``.
Deviations from the reference code, stated:

- ``epsilon`` defaults to ``crowd`` (0.1, the strictest of ``EPSILON``; the reference code's default is 0.2), since a
  certificate gates a deployment. ``q = 0.05``; an item counts when at least two people labelled it; a person with
  fewer than 30 such items is left out (the t-test's normality needs 30), as in the reference code.
- No verdict (``replaces`` is None, ``missing`` says why) with fewer than 3 people tested: the paper recommends at
  least 3, the reference code runs with 2.
- A panel's abstention: with categories it is a label no person gives (it always loses alignment); with a rating
  scale the item is left out and counted (``abstained``). The reference code drops every item the judge did not
  label, which would reward abstaining.
- ``rho`` carries a 95% bootstrap CI over items (the paper reports the point value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from chateval_dspy.errors import ConfigError
from chateval_dspy.run.metrics import ABSTAIN, Estimate, bootstrap

EPSILON = {"expert": 0.2, "skilled": 0.15, "crowd": 0.1}
DEFAULT_KIND = "crowd"
Q_FDR = 0.05
MIN_PEOPLE = 3
MIN_ITEMS = 30
SCORING = ("accuracy", "neg_rmse")


def by_rejections(p_values, q: float = Q_FDR) -> list[bool]:
    """Which nulls the Benjamini-Yekutieli procedure rejects at false discovery rate ``q``.

    The largest rank ``k`` with ``p_(k) <= k / m * q / H_m`` (``H_m = 1 + 1/2 + ... + 1/m``); the ``k`` smallest
    p-values are rejected.

    Example (m = 3, H_3 = 11/6, thresholds 0.00909, 0.01818, 0.02727):
        >>> by_rejections([0.001, 0.5, 0.015])
        [True, False, True]
        >>> by_rejections([0.01, 0.5, 0.9])
        [False, False, False]
    """
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    thresholds = np.arange(1, m + 1) / m * q / np.sum(1.0 / np.arange(1, m + 1))
    passed = np.nonzero(p[order] <= thresholds)[0]
    rejected = np.zeros(m, dtype=bool)
    if len(passed):
        rejected[order[:passed[-1] + 1]] = True
    return rejected.tolist()


def alignment(label, others: list, scoring: str) -> float:
    """How well ``label`` aligns with ``others``: the share equal to it (``accuracy``), or minus the root mean squared
    difference (``neg_rmse``).

    Example:
        >>> alignment("1", ["1", "2"], "accuracy"), alignment(3.0, [1.0, 3.0], "neg_rmse")
        (0.5, -1.4142135623730951)
    """
    if scoring == "accuracy":
        return float(np.mean([label == o for o in others]))
    return -math.sqrt(float(np.mean([(float(label) - float(o)) ** 2 for o in others])))


@dataclass(frozen=True)
class Comparison:
    """The test for one left-out person: its items, the judge's and the person's win rates, p-value, rejection."""

    annotator: str
    n: int
    judge_wins: float  # mean(W_f): the judge aligns with the others at least as well as this person
    person_wins: float  # mean(W_h)
    p_value: float
    rejected: bool


@dataclass(frozen=True)
class AltTest:
    """The test's outcome: per-person comparisons, ``omega``, ``rho`` and the verdict (None: ``missing`` says why)."""

    comparisons: list[Comparison]
    epsilon: float
    q: float
    scoring: str
    rho: Estimate
    skipped: dict[str, int] = field(default_factory=dict)  # people with fewer than MIN_ITEMS items: their count
    abstained: int = 0
    missing: str | None = None

    @property
    def omega(self) -> float:
        return sum(c.rejected for c in self.comparisons) / len(self.comparisons) if self.comparisons else math.nan

    @property
    def replaces(self) -> bool | None:
        return None if self.missing else self.omega >= 0.5

    def line(self) -> str:
        """The one line: ``can replace an annotator on this data: yes/no (omega, rho, p-values)``, or what is missing."""
        head = "can replace an annotator on this data: "
        if self.missing:
            return head + f"not tested: {self.missing}"
        p = ", ".join(f"{c.annotator} {c.p_value:.3g}" for c in self.comparisons)
        return (head + ("yes" if self.replaces else "no")
                + f" (omega={self.omega:.2f}: {sum(c.rejected for c in self.comparisons)} of {len(self.comparisons)}"
                f" people beaten; rho={self.rho}; epsilon={self.epsilon:g}, Benjamini-Yekutieli q={self.q:g}, "
                f"scoring {self.scoring}; p-values: {p})")


def _usable(judged: dict, labels: dict, scoring: str) -> tuple[dict, dict, int]:
    """The judge's labels and the people's on the items the test uses (judged, two people or more)."""
    judge, people, abstained = {}, {}, 0
    for item, by in labels.items():
        value = judged.get(item)
        if value is None and scoring != "accuracy":
            abstained += item in judged
            continue
        if item in judged and len(by) >= 2:
            judge[item], people[item] = ABSTAIN if value is None else value, by
    return judge, people, abstained


def indicators(person: str, judge: dict, people: dict, scoring: str) -> dict[str, tuple[int, int]]:
    """Per item ``person`` labelled: (W_f, W_h)."""
    out = {}
    for item, by in people.items():
        if person not in by:
            continue
        others = [v for who, v in by.items() if who != person]
        judge_score, person_score = alignment(judge[item], others, scoring), alignment(by[person], others, scoring)
        out[item] = (int(judge_score >= person_score), int(person_score >= judge_score))
    return out


def _compare(person: str, wins: dict[str, tuple[int, int]], epsilon: float) -> Comparison:
    from scipy.stats import ttest_1samp

    w_f, w_h = np.array(list(wins.values()), dtype=float).T
    diff = w_h - w_f
    if np.all(diff == diff[0]):  # no variance: the t statistic is +-inf, so the test is decided by the mean alone
        p_value = 0.0 if diff[0] < epsilon else 1.0
    else:
        p_value = float(ttest_1samp(diff, epsilon, alternative="less").pvalue)
    return Comparison(person, len(wins), float(w_f.mean()), float(w_h.mean()), p_value, False)


def _rho(wins: dict[str, dict[str, tuple[int, int]]], *, seed: int, n_resamples: int | None) -> Estimate:
    """Mean over people of mean(W_f), with a 95% bootstrap CI over items (n: the items)."""
    items = sorted({i for w in wins.values() for i in w})

    def statistic(idx) -> float:
        drawn = [items[i] for i in idx]
        means = [np.mean([w[i][0] for i in drawn if i in w]) for w in wins.values() if any(i in w for i in drawn)]
        return float(np.mean(means)) if means else math.nan

    return bootstrap(statistic, list(range(len(items))), seed=seed, n_resamples=n_resamples)


def alt_test(judged: dict[str, str | None], labels: dict[str, dict[str, str]], *, scoring: str = "accuracy",
             epsilon: float | None = None, kind: str = DEFAULT_KIND, q: float = Q_FDR, seed: int = 0,
             n_resamples: int | None = None) -> AltTest:
    """The alternative annotator test of ``judged`` against the people's ``labels`` (see the module for the rules).

    ``judged``: item id -> label (None: abstained); ``labels``: ``{item id: {person: label}}``; ``scoring``:
    ``accuracy`` (categories) or ``neg_rmse`` (rating scales); ``epsilon`` None: ``EPSILON[kind]``.

    Example:
        >>> people = {str(i): {"a": "1", "b": "1", "c": "2" if i % 2 else "1"} for i in range(40)}
        >>> result = alt_test({str(i): "1" for i in range(40)}, people, n_resamples=50)
        >>> result.replaces, [c.rejected for c in result.comparisons]
        (True, [True, True, True])
    """
    if scoring not in SCORING:
        raise ConfigError(f"unknown scoring {scoring!r}; choose one of: {', '.join(SCORING)}")
    if epsilon is None and kind not in EPSILON:
        raise ConfigError(f"unknown kind of annotators {kind!r}; choose one of: {', '.join(EPSILON)}")
    if epsilon is not None and not 0 <= epsilon < 1:
        raise ConfigError(f"epsilon must be in [0, 1), got {epsilon}")
    epsilon = EPSILON[kind] if epsilon is None else float(epsilon)
    judge, people, abstained = _usable(judged, labels, scoring)
    everyone = sorted({who for by in people.values() for who in by})
    wins = {who: indicators(who, judge, people, scoring) for who in everyone}
    skipped = {who: len(w) for who, w in wins.items() if len(w) < MIN_ITEMS}
    wins = {who: w for who, w in wins.items() if who not in skipped}
    tested = [_compare(who, w, epsilon) for who, w in wins.items()]
    comparisons = [replace(c, rejected=r) for c, r in zip(tested, by_rejections([c.p_value for c in tested], q))]
    missing = None
    if len(comparisons) < MIN_PEOPLE:
        left_out = "; ".join(f"{who} has {n} item(s)" for who, n in skipped.items())
        missing = (f"{len(comparisons)} people with >= {MIN_ITEMS} items labelled beside another person and judged "
                   f"(need {MIN_PEOPLE})" + (f"; {left_out}" if left_out else ""))
    return AltTest(comparisons, epsilon, q, scoring, _rho(wins, seed=seed, n_resamples=n_resamples), skipped,
                   abstained, missing)
