"""Per-item metrics DSPy optimizers maximise, ``metric(example, pred, trace=None) -> float``.

Corpus-level kappa cannot be computed per item, so ``balanced`` weights agreement by
the inverse frequency of the human label in the training set: a judge that always
says "1" gains little from it, as with kappa. Test kappa is always reported beside it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import dspy

from chateval_dspy.program.signatures import ASPECTS

Metric = Callable[..., float]


def agreement(example: dspy.Example, pred: dspy.Prediction, trace=None) -> float:
    """1 when the panel's preference equals the human label (ties count), else 0; abstention is 0."""
    return float(pred.preference is not None and pred.preference == example.label)


def balanced(trainset: Sequence[dspy.Example]) -> Metric:
    counts = Counter(x.label for x in trainset)
    weights = {label: len(trainset) / (len(counts) * n) for label, n in counts.items()}

    def balanced_agreement(example, pred, trace=None) -> float:
        return weights.get(example.label, 1.0) * agreement(example, pred, trace)

    return balanced_agreement


def score_error(example: dspy.Example, pred: dspy.Prediction, trace=None) -> float:
    """1 - mean absolute error over aspects, each scaled to 0..1 by its human range; abstention is 0."""
    if pred.abstained:
        return 0.0
    errors = [abs(pred[a] - example.human[a]) / (hi - lo) for a, (lo, hi) in ASPECTS.items()]
    return 1.0 - sum(errors) / len(errors)


METRICS = {"pairwise": ("agreement", "balanced"), "scoring": ("score_error",)}


def make_metric(name: str, fmt: str, trainset: Sequence[dspy.Example]) -> Metric:
    from chateval_dspy.errors import ConfigError

    if name not in METRICS[fmt]:
        raise ConfigError(f"metric {name!r} does not apply to {fmt} items; choose one of: {', '.join(METRICS[fmt])}")
    return {"agreement": agreement, "score_error": score_error}.get(name) or balanced(trainset)


def with_feedback(metric: Metric) -> Callable:
    """GEPA's metric shape: a score plus words a reflection LM can act on."""

    def gepa_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score = metric(gold, pred, trace)
        if "label" in gold:
            feedback = (f"The human referees preferred {gold.label!r}; the panel said {pred.preference!r}"
                        f" (consistent across answer orders: {pred.consistent}).")
        else:
            feedback = "Human scores: " + ", ".join(f"{a} {gold.human[a]:.2f}" for a in ASPECTS) + \
                "; panel: " + ", ".join(f"{a} {pred[a]}" for a in ASPECTS)
        return dspy.Prediction(score=score, feedback=feedback)

    return gepa_metric
