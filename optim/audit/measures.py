"""The bias audit's figures, from verdicts keyed by item id: each a rate with its exact (Clopper-Pearson) 95%
interval, or a mean score shift with its bootstrap interval.

Pairwise verdicts are ``"1"``, ``"2"``, ``"tie"`` or None (no verdict: left out of every figure). A verdict
"moves towards" the answer a probe boosted when it ranks that answer higher than the unperturbed verdict did,
on the order boosted answer > tie > the other answer; the robustness rate is the share of verdicts that did not
change at all (CALM's definition).
"""

from __future__ import annotations

from collections.abc import Mapping

from chateval_dspy.run.metrics import Estimate
from optim.audit.perturb import other
from optim.tuning.selective import exact_rate

DECISIVE = ("1", "2")


def unswapped(verdict: str | None) -> str | None:
    """A verdict on the swapped item, named by the answers' original positions.

    Example:
        >>> unswapped("1"), unswapped("tie"), unswapped(None)
        ('2', 'tie', None)
    """
    return other(verdict) if verdict in DECISIVE else verdict


def flip_rate(original: Mapping[str, str | None], swapped: Mapping[str, str | None]) -> Estimate:
    """Of the items with a decisive unperturbed verdict and any verdict on the swapped item, the share whose
    swapped verdict does not name the same answer (a tie counts as a flip).

    Example:
        >>> flip_rate({"a": "1", "b": "2", "c": "tie"}, {"a": "2", "b": "2", "c": "1"}).value
        0.5
    """
    ids = [i for i, v in original.items() if v in DECISIVE and swapped.get(i) is not None]
    return exact_rate(sum(unswapped(swapped[i]) != original[i] for i in ids), len(ids))


def first_pick_rate(original: Mapping[str, str | None], swapped: Mapping[str, str | None]) -> Estimate:
    """Of the decisive verdicts in both answer orders, the share that picked the answer in the first position.

    The two verdicts of one item are counted as two: the interval treats them as independent.

    Example:
        >>> first_pick_rate({"a": "1", "b": "2"}, {"a": "1", "b": None}).value
        0.6666666666666666
    """
    picks = [v for verdicts in (original, swapped) for i, v in verdicts.items() if i in original and i in swapped
             and v in DECISIVE]
    return exact_rate(sum(v == "1" for v in picks), len(picks))


def position_bias(first: Estimate) -> Estimate:
    """``2 * first - 1`` with its interval: the share of decisive verdicts decided by position rather than content,
    when a verdict not so decided is as likely to pick either position over both orders (as it is for any judge
    whose content-based choice follows the answer and not its place); 0 for a judge without position bias.

    Example:
        >>> str(position_bias(Estimate(0.65, 0.6, 0.7, 400)))
        '0.300 [0.200, 0.400]'
    """
    return Estimate(2 * first.value - 1, 2 * first.low - 1, 2 * first.high - 1, first.n)


def rank(verdict: str, boosted: str) -> int:
    """2 for the boosted answer, 1 for a tie, 0 for the other answer."""
    return 2 if verdict == boosted else 1 if verdict == "tie" else 0


def towards(original: Mapping[str, str | None], perturbed: Mapping[str, str | None],
            boosted: Mapping[str, str]) -> tuple[Estimate, Estimate]:
    """``(towards, robustness)``: of the items with a verdict before and after, the share whose verdict moved
    towards the boosted answer, and the share whose verdict did not change.

    Example:
        >>> moved, same = towards({"a": "1", "b": "1"}, {"a": "2", "b": "1"}, {"a": "2", "b": "2"})
        >>> moved.value, same.value
        (0.5, 0.5)
    """
    ids = [i for i in boosted if original.get(i) is not None and perturbed.get(i) is not None]
    moved = sum(rank(perturbed[i], boosted[i]) > rank(original[i], boosted[i]) for i in ids)
    return exact_rate(moved, len(ids)), exact_rate(sum(perturbed[i] == original[i] for i in ids), len(ids))


def robustness(original: Mapping[str, object], perturbed: Mapping[str, object]) -> Estimate:
    """The share of items with a verdict before and after whose verdict did not change (pointwise: no criterion's).

    Example:
        >>> robustness({"a": {"x": 3}, "b": {"x": 2}}, {"a": {"x": 3}, "b": {"x": 4}}).value
        0.5
    """
    ids = [i for i, v in original.items() if v is not None and perturbed.get(i) is not None]
    return exact_rate(sum(perturbed[i] == original[i] for i in ids), len(ids))


def score_shift(original: Mapping[str, dict | None], perturbed: Mapping[str, dict | None], criterion: str,
                seed: int = 0) -> Estimate:
    """The mean change of a numeric criterion's score (perturbed minus original) over the items that have both,
    with its 95% bootstrap interval.

    Example:
        >>> score_shift({"a": {"x": 3}, "b": {"x": 2}}, {"a": {"x": 4}, "b": {"x": 3}}, "x").value
        1.0
    """
    from chateval_dspy.run.metrics import bootstrap

    diffs = [float(perturbed[i][criterion]) - float(o[criterion]) for i, o in original.items()
             if o is not None and perturbed.get(i) is not None and _numeric(o.get(criterion))
             and _numeric(perturbed[i].get(criterion))]
    return bootstrap(lambda d: sum(d) / len(d), diffs, seed=seed)


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def self_preference(original: Mapping[str, str | None], families: Mapping[str, tuple[str, str]], own: str,
                    labels: Mapping[str, str | None]) -> dict[str, Estimate]:
    """On the items where exactly one answer is of the judge's own model family ``own``: ``panel``, the share of
    decisive verdicts for that answer, and ``people``, the share of decisive human labels for it (the rate a
    judge without self-preference would match).

    Example:
        >>> out = self_preference({"a": "1", "b": "1"}, {"a": ("gpt", "claude"), "b": ("claude", "gpt")}, "gpt",
        ...                       {"a": "2", "b": "2"})
        >>> out["panel"].value, out["people"].value
        (0.5, 0.5)
    """
    mine = {i: str(pair.index(own) + 1) for i, pair in families.items() if list(pair).count(own) == 1}
    panel = [original[i] == a for i, a in mine.items() if original.get(i) in DECISIVE]
    people = [labels[i] == a for i, a in mine.items() if labels.get(i) in DECISIVE]
    return {"panel": exact_rate(sum(panel), len(panel)), "people": exact_rate(sum(people), len(people))}


def accuracy_by_type(original: Mapping[str, str | None], labels: Mapping[str, str | None],
                     types: Mapping[str, str]) -> dict[str, Estimate]:
    """Per bias type, the share of items with a decisive label whose verdict is that label (no verdict: wrong).

    Example:
        >>> out = accuracy_by_type({"a": "1", "b": "2"}, {"a": "1", "b": "1"}, {"a": "length", "b": "length"})
        >>> out["length"].value
        0.5
    """
    ids = {kind: [i for i, t in types.items() if t == kind and labels.get(i) in DECISIVE]
           for kind in sorted(set(types.values()))}
    return {kind: exact_rate(sum(original.get(i) == labels[i] for i in these), len(these)) for kind, these in ids.items()}
