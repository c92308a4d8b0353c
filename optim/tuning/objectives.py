"""Per-item metrics DSPy optimizers maximise, ``metric(example, pred, trace=None) -> float``.

Corpus-level kappa cannot be computed per item, so ``balanced`` weights agreement by the inverse frequency of the
human label in the training set: a judge that always says "1" gains little from it, as with kappa (test kappa is
reported beside it). Pointwise tasks use ``score_error`` over the task's criteria, each on its own scale.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import dspy

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.task import TaskSpec, as_task

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


def score_error_for(task: TaskSpec | str) -> Metric:
    """``score_error`` over a task's criteria: 1 - mean error, each criterion's error scaled to 0..1 (integer
    scales: absolute error over the range; labels: 0 if equal, else 1); criteria without a human label are
    left out; abstention (or no label at all) is 0.

    Example:
        >>> metric = score_error_for("pointwise")
        >>> metric(dspy.Example(human={"naturalness": 3, "coherence": 1, "engagingness": 2, "groundedness": None}),
        ...        dspy.Prediction(abstained=None, naturalness=2, coherence=1, engagingness=2, groundedness=0))
        0.8333333333333334
    """
    task = as_task(task)

    def score_error(example: dspy.Example, pred: dspy.Prediction, trace=None) -> float:
        human = example.get("human") or {}
        if pred.abstained:
            return 0.0
        errors = []
        for c in task.criteria:
            if human.get(c.name) is None:
                continue
            if c.scale.ordinal:
                errors.append(abs(pred[c.name] - human[c.name]) / (c.scale.high - c.scale.low))
            else:
                errors.append(0.0 if pred[c.name] == human[c.name] else 1.0)
        return 1.0 - sum(errors) / len(errors) if errors else 0.0

    return score_error


score_error = score_error_for("pointwise")  # over Topical-Chat's aspects


METRICS = {"pairwise": ("agreement", "balanced"), "pointwise": ("score_error",)}  # each format's first is its default


def make_metric(name: str | None, task: TaskSpec | str, trainset: Sequence[dspy.Example]) -> Metric:
    """The named metric (None: the format's default) for a task, or a format's built-in task."""
    task = as_task(task)
    fmt = task.format
    name = name or METRICS[fmt][0]
    if name not in METRICS[fmt]:
        raise ConfigError(f"metric {name!r} does not apply to {fmt} items; choose one of: {', '.join(METRICS[fmt])}")
    if name == "score_error":
        return score_error_for(task)
    return agreement if name == "agreement" else balanced(trainset)


def with_feedback(metric: Metric, task: TaskSpec | str | None = None) -> Callable:
    """GEPA's metric shape: a score plus words a reflection LM can act on (``task``: whose criteria to name)."""

    def gepa_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score = metric(gold, pred, trace)
        if "label" in gold:
            feedback = (f"The human referees preferred {gold.label!r}; the panel said {pred.preference!r}"
                        f" (consistent across answer orders: {pred.consistent}).")
        else:
            spec = as_task(task or "pointwise")
            human = gold.get("human") or {}
            given = [c.name for c in spec.criteria if human.get(c.name) is not None]
            feedback = "Human scores: " + ", ".join(f"{a} {human[a]:.2f}" if isinstance(human[a], float)
                                                     else f"{a} {human[a]}" for a in given) + \
                "; panel: " + ", ".join(f"{a} {pred[a]}" for a in given)
        return dspy.Prediction(score=score, feedback=feedback)

    return gepa_metric
