"""The summary a person reads after a run: agreement with CIs beside the baseline, and cost."""

from __future__ import annotations

import math

import pandas as pd

from chateval_dspy.run.metrics import Estimate


def _fmt(value) -> str:
    if isinstance(value, Estimate):
        return str(value)
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def summary_table(metrics: dict, cost: dict, header: dict) -> str:
    """A plain-text table: what was run (model, data, split, config), agreement, cost.

    Every agreement figure carries its 95% bootstrap CI in brackets.
    """
    lines = ["  ".join(f"{k}={v}" for k, v in header.items())]
    if metrics:
        rows = []
        if "accuracy" in metrics:
            rows.append(("accuracy", metrics["accuracy"], metrics["majority_accuracy"]))
            rows.append(("kappa", metrics["kappa"], metrics["majority_kappa"]))
            baseline = f"majority class ('{metrics['majority_class']}')"
        else:
            for key, value in metrics.items():
                if isinstance(value, Estimate):
                    rows.append((key, value, "n/a (constant)"))
            baseline = "majority class"
        frame = pd.DataFrame([(k, _fmt(v), _fmt(b)) for k, v, b in rows],
                             columns=["metric", "chateval [95% CI]", baseline])
        lines += ["", frame.to_string(index=False)]
        lines.append(f"items with a human label: {metrics['n'] + (metrics['n_abstained'] if 'accuracy' not in metrics else 0)}"
                     f", abstained: {metrics['n_abstained']}"
                     + (" (counted as disagreement)" if "accuracy" in metrics else " (left out of correlations)"))
    else:
        lines += ["", "(no human labels in these items: no agreement figures)"]
    cost_frame = pd.DataFrame([(k, _fmt(v)) for k, v in cost.items()], columns=["cost", "value"])
    lines += ["", cost_frame.to_string(index=False)]
    if cost.get("cached_calls_per_item"):
        lines.append("(tokens and seconds count only calls that reached the LM; rerun with --no-cache for full costs)")
    return "\n".join(lines)
