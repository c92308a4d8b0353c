"""PNG plots beside the benchmark pages, drawn from the suites' JSON files (matplotlib, Agg backend): agreement
against panel shape and tokens, throughput, and (drawn by their suites) the simulation's and the review suite's."""

from __future__ import annotations

import json
from pathlib import Path

from chateval_dspy.run.metrics import primary_metric
from optim.bench.png import pyplot, save


def _metric(report: dict) -> tuple[str, str]:
    key = primary_metric(report["header"].get("format") or "pointwise")
    return key, key.replace("_", " ").replace("spearman", "Spearman")


def _point(row: dict, key: str):
    m = row["metrics"].get(key) or {}
    v, lo, hi = m.get("value"), m.get("ci_low"), m.get("ci_high")
    if v is None:
        return None
    err = [[v - lo if lo is not None else 0], [hi - v if hi is not None else 0]]
    return v, err


def _subtitle(h: dict) -> str:
    return f"{h['model']} | {h['data']} {h['split']} | n={h['n']} | {h['date']}"


def panel_plot(report: dict, path: Path) -> Path | None:
    rows = {r["name"]: r for r in report["rows"]}
    key, label = _metric(report)
    series = {"roles": [(n, rows.get("chateval" if n == 2 else f"roles_{n}")) for n in range(1, 6)],
              "turns": [(t, rows.get("chateval" if t == 2 else f"turns_{t}")) for t in range(1, 5)]}
    if sum(r is not None for _, r in series["roles"] + series["turns"]) < 3:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (name, points) in zip(axes, series.items()):
        for x, row in points:
            p = row and _point(row, key)
            if p:
                ax.errorbar([x], [p[0]], yerr=p[1], fmt="o", color="C0", capsize=4)
        for ref, color, ls, what in (("single", "C1", "--", "single agent"), ("majority", "C2", ":", "majority class")):
            if ref in rows and _point(rows[ref], key):
                ax.axhline(_point(rows[ref], key)[0], color=color, ls=ls, label=what)
        ax.set_xlabel(f"{name} (other fixed at 2)")
        ax.set_xticks([x for x, _ in points])
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"{label} (95% CI)")
    fig.suptitle(f"ChatEval agreement vs panel shape\n{_subtitle(report['header'])}", fontsize=9)
    return save(fig, path, plt)


def tokens_plot(report: dict, path: Path) -> Path | None:
    key, label = _metric(report)
    pts = [(r, _point(r, key)) for r in report["rows"] if r.get("cost") and _point(r, key)]
    if len(pts) < 2:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for row, (v, err) in pts:
        x = row["cost"]["tokens_per_item"]
        ax.errorbar([x], [v], yerr=err, fmt="o", capsize=3)
        ax.annotate(row["name"], (x, v), textcoords="offset points", xytext=(3, 3), fontsize=7, rotation=40)
        if row["cost"].get("computed_tokens_per_item") is not None:
            ax.plot([row["cost"]["computed_tokens_per_item"]], [v], "x", color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("LM tokens per item (o billed, x computed after prefix-cache reuse; log scale)")
    ax.set_ylabel(f"{label} (95% CI)")
    ax.set_title(f"Tokens vs agreement\n{_subtitle(report['header'])}", fontsize=9)
    return save(fig, path, plt)


def throughput_plot(report: dict, path: Path) -> Path | None:
    blocks = [b for b in report.get("throughput", []) if b["levels"]]
    if not blocks:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for b in blocks:
        ax.plot([t["concurrency"] for t in b["levels"]], [t["speedup"] for t in b["levels"]], "o-", label=b["label"])
    ax.axhline(1.7, color="grey", ls="--", label="target at 2: 1.7x")
    ax.set_xlabel("items judged at once")
    ax.set_ylabel("throughput vs one at a time")
    ax.set_title(f"Throughput ({report['header']['date']}, {report['header']['machine'][:40]})", fontsize=8)
    ax.legend(fontsize=8)
    return save(fig, path, plt)


def draw_all(directory: Path) -> list[Path]:
    """Every plot the JSON files in ``directory`` allow; returns the files written."""
    out = []
    for src in sorted(directory.glob("agreement-*.json")):
        report = json.loads(src.read_text(encoding="utf-8"))
        dataset = src.stem.removeprefix("agreement-")
        out += [p for p in (panel_plot(report, directory / f"agreement-vs-panel-{dataset}.png"),
                            tokens_plot(report, directory / f"tokens-vs-agreement-{dataset}.png")) if p]
    cost = directory / "cost.json"
    if cost.exists():
        p = throughput_plot(json.loads(cost.read_text(encoding="utf-8")), directory / "throughput.png")
        out += [p] if p else []
    simulated = directory / "simulate.json"
    if simulated.exists():
        from optim.bench.simulate.report import plots

        out += plots(json.loads(simulated.read_text(encoding="utf-8")), directory)
    for src in sorted(directory.glob("review-*.json")):
        from optim.bench.review import plots as review_plots

        out += review_plots(json.loads(src.read_text(encoding="utf-8")), directory, src.stem.removeprefix("review-"))
    return out
