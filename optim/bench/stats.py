"""Paired significance against a reference row, and how benchmark figures are printed.

Pairwise rows are compared with the exact McNemar test on per-item correct/incorrect
(a two-sided binomial test on the discordant pairs); pointwise rows with a paired
bootstrap of the difference in mean correlation over the four aspects (the same
resampling as ``chateval_dspy.run.metrics``). Both use only the items the two rows share.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from chateval_dspy.program.task import builtin_task
from chateval_dspy.run.metrics import Estimate, bootstrap, kendall, spearman
from optim.ablation.paired import mcnemar_exact


def mcnemar(reference: dict[str, bool], row: dict[str, bool]) -> dict:
    """Exact McNemar test of ``row`` against ``reference`` (item id -> correct), on their shared items
    (``optim.ablation.paired.mcnemar_exact``), with the accuracy difference.

    Example:
        >>> mcnemar({"a": True, "b": False, "c": False}, {"a": True, "b": True, "c": True})["row_only"]
        2
    """
    out = mcnemar_exact(reference, row)
    out["delta_accuracy"] = (out["row_only"] - out["reference_only"]) / out["n"] if out["n"] else math.nan
    if not out["n"]:
        out["p"] = 1.0  # as it always was for the benchmark tables: no shared item, nothing to test
    return out


def _delta(corr):
    def statistic(*columns) -> float:
        # columns: (human, row, reference) per aspect
        row = [corr(columns[3 * i], columns[3 * i + 1]) for i in range(len(columns) // 3)]
        ref = [corr(columns[3 * i], columns[3 * i + 2]) for i in range(len(columns) // 3)]
        return float(np.mean(row) - np.mean(ref))
    return statistic


def paired_correlation_delta(human: dict[str, dict], reference: dict[str, dict | None], row: dict[str, dict | None],
                             *, seed: int = 0, n_resamples: int | None = None) -> dict:
    """Difference in mean (over aspects) Spearman and Kendall, row minus reference, with a paired bootstrap CI."""
    shared = [i for i in human if reference.get(i) is not None and row.get(i) is not None]
    columns, aspects = [], builtin_task("pointwise").ordinal_ranges  # Topical-Chat's criteria
    for aspect in aspects:
        columns += [[float(human[i][aspect]) for i in shared], [float(row[i][aspect]) for i in shared],
                    [float(reference[i][aspect]) for i in shared]]
    out = {"test": "paired bootstrap", "n": len(shared)}
    none = Estimate(math.nan, math.nan, math.nan, 0)
    for name, corr in (("spearman", spearman), ("kendall", kendall)):
        out[f"delta_average_{name}"] = (bootstrap(_delta(corr), *columns, seed=seed, n_resamples=n_resamples) if shared
                                           else none).to_dict()
    # Per aspect too: a judge with a constant aspect leaves the average undefined, not the other aspects.
    for i, aspect in enumerate(aspects):
        cols = columns[3 * i: 3 * i + 3]
        out[f"delta_{aspect}_spearman"] = (bootstrap(_delta(spearman), *cols, seed=seed, n_resamples=n_resamples) if shared
                                            else none).to_dict()
    return out


def fmt_est(d: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    """``0.474 [0.401, 0.552]``; ``n/a`` for an undefined figure, ``(no CI)`` when too few items."""
    if not d or d.get("value") is None or math.isnan(d["value"]):
        return "n/a"
    v = f"{d['value'] * scale:.{digits}f}"
    if d.get("ci_low") is None or math.isnan(d["ci_low"]):
        return f"{v} (no CI)"
    return f"{v} [{d['ci_low'] * scale:.{digits}f}, {d['ci_high'] * scale:.{digits}f}]"


def fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_num(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def proportion(k: int, n: int) -> dict:
    """A rate with its exact (Clopper-Pearson) 95% interval."""
    if not n:
        return {"value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": 0}
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return {"value": k / n, "ci_low": float(ci.low), "ci_high": float(ci.high), "n": n}
