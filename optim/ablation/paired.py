"""Two panels judged on the same items, compared item by item.

Pairwise: the exact McNemar test (an item one panel gets right and the other wrong is a fair coin under "neither is
better"). A scored task's agreement is a rank correlation no single item carries, so its difference gets a paired
percentile bootstrap CI (items resampled once for both panels). An abstention is a wrong pairwise verdict, as in
the metrics; a scored item that either panel abstained on is left out of both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy import stats

from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.run.metrics import Estimate, accuracy, bootstrap, label_accuracy, spearman


def mcnemar_exact(reference: Mapping[str, bool], row: Mapping[str, bool]) -> dict:
    """Exact McNemar test of ``row`` against ``reference`` (item id -> verdict correct) on their shared items.

    Returns ``test``, ``n`` (shared items), ``reference_only`` and ``row_only`` (items only that panel got
    right) and the two-sided ``p`` (1.0 when no item is discordant, NaN when no item is shared).

    Example:
        >>> r = mcnemar_exact({"a": False, "b": False, "c": False, "d": True}, {"a": True, "b": True, "c": True, "d": True})
        >>> r["row_only"], r["reference_only"], r["p"]  # 2 x (1/2)^3
        (3, 0, 0.25)
    """
    shared = [i for i in reference if i in row]
    reference_only = sum(bool(reference[i]) and not row[i] for i in shared)
    row_only = sum(bool(row[i]) and not reference[i] for i in shared)
    discordant = reference_only + row_only
    p = float(stats.binomtest(row_only, discordant, 0.5).pvalue) if discordant else 1.0 if shared else math.nan
    return {"test": "exact McNemar", "n": len(shared), "reference_only": reference_only, "row_only": row_only,
            "p": p}


def _criterion_pairs(human: Sequence[dict], predicted: Sequence[dict], name: str) -> tuple[list, list]:
    """The items where the human label of ``name`` is given (None or NaN marks a missing one)."""
    keep = [(h[name], p[name]) for h, p in zip(human, predicted)
            if h.get(name) is not None and not (isinstance(h[name], float) and math.isnan(h[name]))]
    return [h for h, _ in keep], [p for _, p in keep]


def agreement_statistic(task: TaskSpec | str) -> Callable[[Sequence, Sequence], float]:
    """``statistic(human, predicted)``: the task's primary agreement figure (``metrics.primary_metric``) without
    its CI: pairwise accuracy; else the mean Spearman over ordinal criteria, or, with none, the mean label accuracy.

    Example:
        >>> agreement_statistic("pairwise")(["1", "2", "tie"], ["1", "1", "tie"])
        0.6666666666666666
        >>> round(agreement_statistic("pointwise")([{"naturalness": 1, "coherence": 1, "engagingness": 1, "groundedness": 0},
        ...                                 {"naturalness": 3, "coherence": 3, "engagingness": 3, "groundedness": 1}],
        ...                                [{"naturalness": 1, "coherence": 2, "engagingness": 1, "groundedness": 0},
        ...                                 {"naturalness": 2, "coherence": 3, "engagingness": 2, "groundedness": 1}]), 6)
        1.0
    """
    task = as_task(task)
    if task.format == "pairwise":
        return accuracy
    ordinal = [c.name for c in task.criteria if c.scale.ordinal]
    names, fn = (ordinal, spearman) if ordinal else ([c.name for c in task.criteria], label_accuracy)

    def statistic(human, predicted) -> float:
        # NaN if any criterion is undefined (a constant column): an average must not hide a missing part.
        return float(np.mean([fn(*_criterion_pairs(human, predicted, name)) for name in names]))
    return statistic


def paired_delta(task: TaskSpec | str, human: Sequence, row: Sequence, reference: Sequence, *,
                 seed: int = 0, n_resamples: int | None = None) -> Estimate:
    """``row``'s agreement minus ``reference``'s (the task's primary figure; verdicts None: abstained) on the items
    of ``human``, in its order, with a paired 95% bootstrap CI.

    Example:
        >>> d = paired_delta("pairwise", ["1", "2", "1", "2"], ["1", "2", "1", "2"], ["1", "1", "1", "1"])
        >>> d.value, d.n
        (0.5, 4)
    """
    statistic = agreement_statistic(task)
    return bootstrap(lambda h, r, f: statistic(h, r) - statistic(h, f), list(human), list(row), list(reference),
                     seed=seed, n_resamples=n_resamples)
