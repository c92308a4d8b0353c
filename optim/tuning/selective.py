"""Selective verdicts: a confidence threshold chosen so that the verdicts given agree with people at a stated level.

``choose_threshold`` picks the lowest threshold such that, with probability at least ``1 - risk`` over the
calibration draw, verdicts at or above it agree with people at least ``level`` of the time; items below it get no
verdict (``ABSTAINED``). The procedure is Trust or Escalate's (Jung, Brahman and Choi, ICLR 2025, arXiv 2407.18370):
fixed-sequence testing from the highest candidate down, with the exact p-value ``P(Binomial(n, 1 - level) <= k)``
(``k`` of ``n`` items at or above a candidate disagreeing), stopping at the first failure (a later candidate that
would pass is never taken: that keeps the family-wise error at ``risk``). What it promises: docs/selective.md.

Deviations from the paper, stated:

- Candidates are the distinct calibration confidences, not a 5,000-point grid: ``(n, k)`` only changes at an
  observed confidence, so this is what an arbitrarily fine grid tests, whatever the scale.
- Testing starts at the highest candidate with at least ``min_items`` items at or above it (30, as the authors' code)
  and ``(1 - alpha) ** n <= risk`` (below that even ``k = 0`` fails): the start depends on the confidences, never the
  labels; ``python -m optim.bench selective`` measures how often the guarantee holds.
- When no candidate passes, the threshold is ``None`` (every item abstains; the paper's code returns its highest)
  and ``best_level`` is the largest level on a 0.001 grid below the one asked for that the procedure reaches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chateval_dspy.run.metrics import Estimate, plain

ABSTAINED = "abstained: needs a person"
LEVEL_STEP = 0.001  # the grid on which the best reachable level is reported
# Testing starts where at least this many calibration items lie above the threshold, as in the authors' code: the
# few items at the very top rarely pass, and a failure there would end the sequence before it reached any others.
MIN_ITEMS = 30


def exact_rate(k: int, n: int) -> Estimate:
    """``k / n`` with its exact (Clopper-Pearson) 95% interval; NaN when ``n`` is 0.

    Example:
        >>> str(exact_rate(9, 10))
        '0.900 [0.555, 0.997]'
    """
    if not n:
        return Estimate(math.nan, math.nan, math.nan, 0)
    from scipy import stats

    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=0.95, method="exact")
    return Estimate(k / n, float(ci.low), float(ci.high), int(n))


def rate_text(e: Estimate, empty: str = "n/a") -> str:
    """A rate with its interval and n as the commands print it; ``empty`` when nothing was counted."""
    return empty if not e.n else f"{e.value:.1%} [{e.low:.1%}, {e.high:.1%}] of {e.n}"


@dataclass(frozen=True)
class Selection:
    """A chosen threshold and what it guarantees: verdicts with confidence ``>= threshold`` (None: no threshold
    reaches ``level``) agree with people at least ``level`` of the time but with chance ``risk``. ``coverage`` and
    ``agreement`` are in-sample, on the ``n_calibration`` items at or above the threshold (exact 95% CIs);
    ``best_level``: when unreachable, the largest level reachable at this risk (module docstring), else None.
    """

    level: float
    risk: float
    threshold: float | None
    n_calibration: int
    coverage: Estimate
    agreement: Estimate
    best_level: float | None = None

    @property
    def reached(self) -> bool:
        return self.threshold is not None

    def describe(self) -> str:
        """One line: what is guaranteed, or that the level cannot be reached and what can."""
        n = self.n_calibration
        if self.reached:
            return (f"With probability at least {1 - self.risk:.0%}, verdicts with confidence >= {self.threshold:.4g} "
                    f"agree with people at least {self.level:.1%} of the time (exact binomial fixed-sequence test on "
                    f"{n} calibration items; holds for items drawn like them); coverage {rate_text(self.coverage)}, "
                    f"calibration agreement above it {rate_text(self.agreement)}.")
        best = (f"the best level reachable at this risk is {self.best_level:.1%}" if self.best_level is not None
                else "no level can be guaranteed at this risk")
        return (f"Agreement of at least {self.level:.1%} cannot be guaranteed at risk {self.risk:g} with these {n} "
                f"calibration items: every item is {ABSTAINED}; {best}.")

    def to_dict(self) -> dict:
        return plain(vars(self))


def _checked(confidence: Sequence[float], agreed: Sequence[bool], level: float, risk: float) -> tuple:
    """Validated calibration data as arrays; a ValueError naming the bad value and where it is."""
    for name, value in (("level", level), ("risk", risk)):
        if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
            raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    if len(confidence) != len(agreed):
        raise ValueError(f"confidence has {len(confidence)} items but agreed has {len(agreed)}: one of each per item")
    conf = np.asarray([float(c) for c in confidence], dtype=float)
    bad = np.flatnonzero(~np.isfinite(conf))
    if bad.size:
        raise ValueError(f"confidence[{bad[0]}] is {conf[bad[0]]}: every calibration item needs a finite confidence")
    for i, a in enumerate(agreed):
        if a not in (True, False):  # 0 and 1 compare equal to False and True
            raise ValueError(f"agreed[{i}] is {a!r}: it must say whether the verdict agreed with people (True/False)")
    return conf, np.asarray([bool(a) for a in agreed])


def candidates(confidence: np.ndarray, agreed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct confidences from the highest down, with ``n`` items at or above each and ``k`` of them disagreeing.

    Example:
        >>> t, n, k = candidates(np.array([0.9, 0.8, 0.9, 0.7]), np.array([True, False, True, True]))
        >>> t.tolist(), n.tolist(), k.tolist()
        ([0.9, 0.8, 0.7], [2, 3, 4], [0, 1, 1])
    """
    if not confidence.size:
        return confidence, np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    order = np.argsort(-confidence, kind="stable")
    conf, wrong = confidence[order], ~agreed[order]
    n_at = np.arange(1, conf.size + 1)
    k_at = np.cumsum(wrong)
    last_of_value = np.flatnonzero(np.append(conf[1:] != conf[:-1], True))  # every item with that confidence counted
    return conf[last_of_value], n_at[last_of_value], k_at[last_of_value]


def fixed_sequence(n: np.ndarray, k: np.ndarray, *, level: float, risk: float, min_items: int = MIN_ITEMS) -> int | None:
    """Index of the last candidate that passes, testing from the first with at least ``min_items`` items that can
    pass at all; None when that one fails.

    Example:
        >>> fixed_sequence(np.array([20, 30, 40]), np.array([0, 1, 12]), level=0.85, risk=0.1, min_items=1)
        1
    """
    from scipy.stats import binom

    alpha = 1.0 - level
    can_pass = np.flatnonzero(((1.0 - alpha) ** n <= risk) & (n >= min_items))  # even k = 0 fails with fewer items
    if not can_pass.size:
        return None
    start = can_pass[0]
    p = binom.cdf(k[start:], n[start:], alpha)
    failed = np.flatnonzero(p > risk)
    if not failed.size:
        return int(n.size - 1)
    return None if failed[0] == 0 else int(start + failed[0] - 1)


def best_level(n: np.ndarray, k: np.ndarray, *, below: float, risk: float, min_items: int = MIN_ITEMS) -> float | None:
    """The largest level on the 0.001 grid, strictly below ``below``, at which ``fixed_sequence`` passes."""
    top = math.ceil(round(below / LEVEL_STEP, 6)) - 1
    for i in range(top, 0, -1):
        level = round(i * LEVEL_STEP, 3)
        if fixed_sequence(n, k, level=level, risk=risk, min_items=min_items) is not None:
            return level
    return None


def choose_threshold(confidence: Sequence[float], agreed: Sequence[bool], *, level: float, risk: float,
                     min_items: int = MIN_ITEMS) -> Selection:
    """The lowest threshold whose verdicts agree with people at least ``level`` of the time with probability
    ``>= 1 - risk`` (see the module docstring). ``confidence`` may be on any scale: only the order matters.

    Example:
        >>> s = choose_threshold([0.9] * 40 + [0.6] * 10, [True] * 40 + [False] * 10, level=0.85, risk=0.1)
        >>> s.threshold, s.coverage.value
        (0.9, 0.8)
        >>> choose_threshold([0.9] * 5, [True] * 5, level=0.85, risk=0.1, min_items=1).best_level
        0.63
    """
    conf, ok = _checked(confidence, agreed, level, risk)
    thresholds, n, k = candidates(conf, ok)
    chosen = fixed_sequence(n, k, level=level, risk=risk, min_items=min_items)
    total = int(conf.size)
    if chosen is None:
        return Selection(level, risk, None, total, exact_rate(0, total), exact_rate(0, 0),
                         best_level(n, k, below=level, risk=risk, min_items=min_items))
    covered, wrong = int(n[chosen]), int(k[chosen])
    return Selection(level, risk, float(thresholds[chosen]), total, exact_rate(covered, total),
                     exact_rate(covered - wrong, covered))


def select(confidence: Sequence[float | None], selection: Selection) -> list[bool]:
    """Which items get a verdict (True); the others are ``ABSTAINED``. An item without a confidence (None or NaN)
    abstains: no guarantee covers it.

    Example:
        >>> s = choose_threshold([0.9] * 40 + [0.6] * 10, [True] * 40 + [False] * 10, level=0.85, risk=0.1)
        >>> select([0.95, 0.9, 0.7, None], s)
        [True, True, False, False]
    """
    if selection.threshold is None:
        return [False] * len(confidence)
    return [c is not None and not math.isnan(float(c)) and float(c) >= selection.threshold for c in confidence]


@dataclass(frozen=True)
class Cascade:
    """Per-stage thresholds of a cascade (cheapest stage first: each stage's ``Selection`` at ``risk / len(stages)``
    on the calibration items that reach it), and the coverage and agreement of all its verdicts there (exact 95% CIs).
    """

    stages: tuple[Selection, ...]
    level: float
    risk: float
    coverage: Estimate
    agreement: Estimate

    @property
    def reached(self) -> bool:
        """Some stage reached the level (it has a threshold): the cascade gives verdicts with the guarantee."""
        return any(s.reached for s in self.stages)

    @property
    def best_level(self) -> float | None:
        """When no stage reached the level, the best level a stage reaches at this risk (each was tested on every
        calibration item, as none kept any); else None."""
        return None if self.reached else max((s.best_level for s in self.stages if s.best_level is not None),
                                             default=None)


def route(stage_confidences: Sequence[Sequence[float | None]], cascade: Cascade) -> list[int | None]:
    """The stage each item leaves at (its first stage whose confidence clears that stage's threshold), or None.

    Example:
        >>> one = choose_threshold([0.9] * 40 + [0.6] * 10, [True] * 40 + [False] * 10, level=0.85, risk=0.1)
        >>> route([[0.9, 0.6], [0.9, 0.6]], Cascade((one, one), 0.85, 0.2, exact_rate(0, 0), exact_rate(0, 0)))
        [0, None]
    """
    if len(stage_confidences) != len(cascade.stages):
        raise ValueError(f"{len(stage_confidences)} stages of confidences for a cascade of {len(cascade.stages)}")
    leaves: list[int | None] = [None] * len(stage_confidences[0])
    for s, (conf, selection) in enumerate(zip(stage_confidences, cascade.stages)):
        for i, given in enumerate(select(conf, selection)):
            if given and leaves[i] is None:
                leaves[i] = s
    return leaves


def choose_cascade_thresholds(stages: Sequence[tuple[Sequence[float], Sequence[bool]]], *, level: float,
                              risk: float) -> Cascade:
    """Thresholds for a cascade: each stage's ``choose_threshold`` at ``risk / len(stages)`` (Bonferroni; the
    authors' code tests every stage at the full risk), on the calibration items no earlier stage kept. ``stages``:
    per stage, ``(confidence, agreed)`` over the same items in the same order.

    Each stage's guarantee is taken as given the earlier stages' thresholds (Trust or Escalate's construction, not a
    theorem proved here: those thresholds are chosen on the same items, so which items reach a stage depends on
    earlier labels; disjoint calibration items per stage would make it exact). Then by Bonferroni every stage, and
    so every verdict the cascade gives, reaches ``level`` with probability ``>= 1 - risk``.

    Example:
        >>> cheap = ([0.9] * 40 + [0.6] * 40, [True] * 40 + [False] * 40)
        >>> panel = ([0.5] * 40 + [0.95] * 40, [True] * 80)
        >>> c = choose_cascade_thresholds([cheap, panel], level=0.85, risk=0.2)
        >>> [s.threshold for s in c.stages], c.coverage.value
        ([0.9, 0.95], 1.0)
    """
    if not stages:
        raise ValueError("a cascade needs at least one stage")
    sizes = {len(conf) for conf, _ in stages} | {len(agreed) for _, agreed in stages}
    if len(sizes) != 1:
        raise ValueError(f"every stage must give (confidence, agreed) over the same calibration items; sizes {sorted(sizes)}")
    remaining = np.arange(sizes.pop())
    chosen, given, right = [], 0, 0
    for conf, agreed in stages:
        conf_here = [conf[i] for i in remaining]
        agreed_here = [agreed[i] for i in remaining]
        selection = choose_threshold(conf_here, agreed_here, level=level, risk=risk / len(stages))
        kept = np.asarray(select(conf_here, selection), dtype=bool)
        given += int(kept.sum())
        right += sum(bool(a) for a, keep in zip(agreed_here, kept) if keep)
        chosen.append(selection)
        remaining = remaining[~kept]
    total = given + remaining.size
    return Cascade(tuple(chosen), level, risk, exact_rate(given, total), exact_rate(right, given))
