"""The ablation's table and plot, drawn from its summary (``AblationResult.to_dict()``, saved as ``ablation.json``),
so either can be made again from the file alone."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from chateval_dspy.lm.pricing import usd_text


def _est(d: dict | None, signed: bool = False) -> str:
    """``0.500 [0.200, 0.800]``; ``n/a`` when undefined, ``(no CI)`` with too few items."""
    if not d or d.get("value") is None or math.isnan(d["value"]):
        return "n/a"
    f = "{:+.3f}" if signed else "{:.3f}"
    if d.get("ci_low") is None or math.isnan(d["ci_low"]):
        return f"{f.format(d['value'])} (no CI: n={d.get('n')})"
    return f"{f.format(d['value'])} [{f.format(d['ci_low'])}, {f.format(d['ci_high'])}]"


def ablation_table(summary: dict) -> str:
    """What was judged (model, data, split, items, panel), then one line per variant.

    Example:
        >>> row = {"variant": "full panel", "roles": ["a", "b"], "n": 4, "vs_full": None,
        ...        "agreement": {"value": 0.5, "ci_low": 0.0, "ci_high": 1.0, "n": 4},
        ...        "cost": {"calls_per_item": 4.0, "tokens_per_item": 100.0, "cost_usd_per_item": "unpriced"}}
        >>> print(ablation_table({"header": {"model": "m"}, "metric": "accuracy", "test": "exact McNemar",
        ...                       "rows": [row]}))  # doctest: +ELLIPSIS
        model=m
        <BLANKLINE>
           variant roles  n   accuracy [95% CI] ...
        full panel   a,b  4 0.500 [0.000, 1.000] ...
        ...
    """
    metric, pairwise = summary["metric"], summary["test"] == "exact McNemar"
    lines = ["  ".join(f"{k}={v}" for k, v in summary["header"].items()), ""]
    rows = []
    for r in summary["rows"]:
        vs, cost = r.get("vs_full"), r["cost"]
        line = {"variant": r["variant"], "roles": ",".join(r["roles"]), "n": r["n"],
                f"{metric} [95% CI]": _est(r["agreement"]),
                "Δ vs full [95% CI]": _est(vs["delta"], signed=True) if vs else "-"}
        if pairwise:
            p = vs["p"] if vs else None
            line["McNemar p"] = "-" if p is None or math.isnan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"
            line["right only (full/variant)"] = f"{vs['reference_only']}/{vs['row_only']}" if vs else "-"
        line.update({"calls/item": f"{cost['calls_per_item']:.1f}", "tokens/item": f"{cost['tokens_per_item']:,.0f}",
                     "USD/item": usd_text(cost["cost_usd_per_item"])})
        rows.append(line)
    lines.append(pd.DataFrame(rows).to_string(index=False))
    how = ("exact McNemar test (two-sided) on the items one panel got right and the other wrong; Δ: paired "
           "bootstrap 95% CI" if pairwise else "Δ: paired bootstrap 95% CI over the items both panels judged")
    lines += ["", f"vs full: {how}. An abstention counts as a wrong verdict."]
    cached = [r["variant"] for r in summary["rows"] if r["cost"].get("cached_calls_per_item")]
    if cached:  # a rerun's replayed calls: billed once, in the run that made them
        lines.append(f"Some calls were answered from the LM cache and cost no tokens here ({', '.join(cached)}).")
    return "\n".join(lines)


def ablation_plot(summary: dict, path: Path) -> Path | None:
    """Left: each variant's agreement with its 95% CI, the full panel's as a line. Right: agreement against
    LM tokens per item, one point per variant. None when no variant has a defined agreement figure."""
    rows = [r for r in summary["rows"] if r["agreement"]["value"] is not None
            and not math.isnan(r["agreement"]["value"])]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    def err(r):  # a bound without a CI draws no bar
        a = r["agreement"]
        return [[0 if math.isnan(d) else d] for d in (a["value"] - a["ci_low"], a["ci_high"] - a["value"])]

    h = summary["header"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * len(rows) + 2.5))
    span = max(r["cost"]["tokens_per_item"] for r in rows) or 1.0
    stacked: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        color = "C0" if r["slug"] == "full" else "C1" if r.get("left_out") else "C2"
        x, y = r["cost"]["tokens_per_item"], r["agreement"]["value"]
        left.errorbar([y], [i], xerr=err(r), fmt="o", color=color, capsize=4)
        right.errorbar([x], [y], yerr=err(r), fmt="o", color=color, capsize=3, alpha=0.8)
        # Variants of one size cost about the same and often agree as well: their labels are stacked, not overprinted.
        spot = (round(10 * x / span), round(y, 2))
        stacked[spot] = stacked.get(spot, -1) + 1
        right.annotate(r["variant"], (x, y), textcoords="offset points", xytext=(5, 4 + 9 * stacked[spot]), fontsize=7)
    left.axvline(summary["rows"][0]["agreement"]["value"], color="C0", ls="--", lw=1)
    left.set_yticks(range(len(rows)), [r["variant"] for r in rows], fontsize=8)
    left.invert_yaxis()
    left.set_xlabel(f"{summary['metric']} (95% CI); dashed: the full panel")
    right.set_xlabel("LM tokens per item")
    right.set_ylabel(f"{summary['metric']} (95% CI)")
    fig.suptitle(f"Which referee earns its cost: full panel, each left out (orange), each alone (green)\n"
                 f"{h['model']} | {h['data']} {h['split']} | n={h['items']}", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
