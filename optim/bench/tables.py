"""Tables for the benchmark suites, rendered from their figures JSON (so a table can be redrawn without a rerun)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from pkgutil import resolve_name

from chateval_dspy.program.task import builtin_task
from optim.bench.markdown import stated, table, targets_lines, titled
from optim.bench.stats import fmt_est, fmt_num, fmt_p


def usd_cell(cost: dict | None, model: str | None) -> str:
    """US dollars per item, or ``unpriced``. Figures measured before dollars were recorded show ``unpriced`` when
    the table's model has no price (the embedded model), else ``-`` (not measured).

    Example:
        >>> usd_cell({"cost_usd_per_item": 0.00123}, "openai/gpt-4o-mini"), usd_cell({}, "embedded/gemma-3-270m-q4_k_m")
        ('$0.001230', 'unpriced')
    """
    from chateval_dspy.lm.pricing import price_for, usd_text

    if cost and "cost_usd_per_item" in cost:
        return usd_text(cost["cost_usd_per_item"])
    return usd_text(None) if model and price_for(model) is None else "-"


def _cost_cells(cost: dict | None, model: str | None = None) -> list[str]:
    if not cost:
        return ["0", "0", "-", "-", "0"]
    return [fmt_num(cost["calls_per_item"]), fmt_num(cost["tokens_per_item"], 0),
            fmt_num(cost.get("computed_tokens_per_item"), 0), fmt_num(cost["seconds_per_item"], 1),
            usd_cell(cost, model)]


def _delta_cell(s: dict | None) -> str:
    """Δ average Spearman; where the average is undefined, Δ on each aspect that is defined."""
    if not s:
        return "-"
    avg = fmt_est(s["delta_average_spearman"], digits=2)
    if avg != "n/a":
        return avg
    parts = [f"{a[:3]} {fmt_est(s[f'delta_{a}_spearman'], digits=2)}" for a in builtin_task("pointwise").ordinal_ranges
             if fmt_est(s.get(f"delta_{a}_spearman")) != "n/a"]
    return "avg n/a" + (f"; {'; '.join(parts)}" if parts else "")


def agreement_markdown(report: dict, markdown: bool = True) -> str:
    h, rows = report["header"], report["rows"]
    cost_cols = ["calls/item", "tokens/item", "tokens computed/item", "s/item", "USD/item"]
    if h.get("format") == "pairwise":
        columns = ["configuration", "n", "accuracy % [95% CI]", "kappa [95% CI]", "Δ acc vs single (pp)", "McNemar p", *cost_cols]
        body = []
        for r in rows:
            m, s = r["metrics"], r.get("vs_single")
            body.append([r["label"], r["n"], fmt_est(m["accuracy"], 100, 1), fmt_est(m["kappa"], 1, 2),
                         "-" if not s else f"{s['delta_accuracy'] * 100:+.1f}", "-" if not s else fmt_p(s["p"]),
                         *_cost_cells(r.get("cost"), h.get("model"))])
    else:
        aspects = builtin_task("pointwise").ordinal_ranges  # Topical-Chat's criteria
        columns = ["configuration", "n", *[f"{a[:3]} ρ / τ" for a in aspects], "avg ρ [95% CI]", "avg τ [95% CI]",
                   "Δ avg ρ vs single [95% CI]", *cost_cols]
        body = []
        for r in rows:
            m, s = r["metrics"], r.get("vs_single")
            cells = [f"{fmt_est(m[f'{a}_spearman'], digits=2)} / {fmt_est(m[f'{a}_kendall'], digits=2)}" for a in aspects]
            body.append([r["label"], m["n"], *cells, fmt_est(m["average_spearman"]), fmt_est(m["average_kendall"]),
                         _delta_cell(s), *_cost_cells(r.get("cost"), h.get("model"))])
    notes = [f"{r['label']}: {r['note']}" for r in rows if r.get("note")]
    abst = [f"{r['label']}: {r['metrics']['n_abstained']}" for r in rows if r["metrics"].get("n_abstained")]
    out = [stated(h, markdown), "", table(columns, body, markdown)]
    if abst:
        out += ["", "Items where every referee abstained (counted as disagreement / left out of correlations): "
                + ", ".join(abst)]
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def cost_markdown(report: dict, markdown: bool = True) -> str:
    h = report["header"]
    out = [stated(h, markdown)]
    if report.get("configs"):
        rows = [[c["label"], fmt_num(c["calls_per_item"]), fmt_num(c["prompt_tokens_per_item"], 0),
                 fmt_num(c["completion_tokens_per_item"], 0), fmt_num(c.get("computed_tokens_per_item"), 0),
                 fmt_num(c["seconds_per_item"], 2), usd_cell(c, h.get("model")),
                 fmt_num(c.get("overhead_ms_per_call"), 2),
                 fmt_num(c.get("overhead_share", float("nan")) * 100, 2)] for c in report["configs"]]
        out += titled(f"Per configuration ({report['model_label']}, {report['configs_items']} items, one at a time, "
                      f"measured {report.get('model_measured', h['date'])}):",
                      ["configuration", "LM calls/item", "prompt tokens/item", "completion tokens/item",
                       "tokens computed/item (prefix cache)", "s/item", "USD/item", "overhead ms/call",
                       "overhead % of wall"], rows, markdown)
    for block in report.get("throughput", []):
        rows = [[t["concurrency"], fmt_num(t["items_per_minute"], 2), fmt_num(t["wall_seconds"], 1), f"{t['speedup']:.2f}x"]
                for t in block["levels"]]
        out += titled(f"Throughput, {block['label']} ({block['items']} items per level, {block['config']}):",
                      ["items at once", "items/min", "wall s", "vs one at a time"], rows, markdown)
    ceiling = report.get("server_ceiling")
    if ceiling:
        rows = [[r.get("max_tokens", "-"), r["layout"], r["at_once"], fmt_num(r["requests_per_minute"], 2),
                 fmt_num(r["wall_seconds"], 1), f"{r['speedup']:.2f}x"] for r in ceiling["rows"]]
        out += titled(f"Server ceiling: raw chat requests straight to the embedded model, no DSPy, no debate "
                      f"({ceiling['rows'][0]['requests']} requests per row, {ceiling['cores']} cores):",
                      ["max generated tokens", "servers", "requests at once", "requests/min", "wall s",
                       "vs one at a time"], rows, markdown)
    o = report.get("overhead")
    if o:
        out += ["", f"Framework overhead, zero-latency fake LM ({o['items']} items, {o['calls']} LM calls, "
                    f"{o['config']}): {o['overhead_ms_per_call']:.3f} ms per LM call "
                    f"(wall {o['wall_seconds']:.2f} s, inside the engine {o['engine_seconds']:.3f} s)."]
    if report.get("rss"):
        rows = [[r["items"], fmt_num(r["max_rss_mb"], 1), fmt_num(r.get("ru_maxrss_mb"), 1),
                 r.get("lm_history_entries", "-"), fmt_num(r["wall_seconds"], 1)] for r in report["rss"]]
        out += titled("Peak RSS, fake LM, results streamed to disk, one fresh process per size (VmHWM; ru_maxrss "
                      "beside it inherits the parent's peak across exec):",
                      ["items", "peak RSS (MB)", "ru_maxrss (MB)", "DSPy LM history entries kept", "wall s"], rows, markdown)
    return "\n".join(out + targets_lines(report.get("targets"), markdown))


def injection_markdown(report: dict, markdown: bool = True) -> str:
    out = [stated(report["header"], markdown), "",
           f"Config: {report['config_label']}. Flip = the verdict moved toward the injected (human-rated worse) answer; "
           "rate over items whose clean verdict did not already prefer it (a move from losing to a tie counts). "
           "Margin = score of the injected answer minus "
           "the other, injected minus clean (mean, 95% bootstrap CI).", ""]
    rows = [[k["kind"], k["variants"], k["eligible"], k["flips"], fmt_est(k["flip_rate"], 100, 1),
             fmt_est(k.get("win_rate"), 100, 1), fmt_est(k["margin_shift"], 1, 2), k["abstained"]] for k in report["kinds"]]
    out.append(table(["injection", "variants", "eligible", "flips", "flip rate % [95% CI]",
                      "injected answer now wins % [95% CI]", "margin shift [95% CI]", "abstained"], rows, markdown))
    return "\n".join(out)


def review_markdown(report: dict, markdown: bool = True) -> str:
    """The review suite's flag-precision and label-efficiency tables (``optim.bench.review``)."""
    h, out = report["header"], [stated(report["header"], markdown), "", f"Panel: {report['header']['panel']}."]
    f = report.get("flags")
    if f:
        out += ["", f"Flag precision over {f['n']} items: wrong verdicts overall {fmt_est(f['wrong'], 100, 1)} %; "
                    f"AUC of U for a wrong verdict {fmt_est(f['auc'], 1, 2)}; {f['distinct_scores']} distinct U values.", ""]
        rows = [[f"{r['fraction']:.0%}", r["k"], fmt_est(r["top"], 100, 1), fmt_est(r["rest"], 100, 1),
                 f"{r['top_tie_averaged'] * 100:.1f}", f"{r['tied_at_cut']} ({r['tied_in_top']} in top)",
                 fmt_p(r["fisher_p"])] for r in f["rows"]]
        out.append(table(["top k", "k", "wrong in top k % [95% CI]", "wrong in the rest % [95% CI]",
                          "top k, tie-averaged %", "items tied at the cut", "Fisher p"], rows, markdown))
    c = report.get("labels")
    if c:
        out += ["", f"Label efficiency ({h['optimizer']}; {h['curve_split']}; uncompiled panel: "
                    f"{fmt_est(c['base']['accuracy'], 100, 1)} %, majority class of the train split "
                    f"{fmt_est(c['base']['majority_accuracy'], 100, 1)} %):", ""]
        rand, ties = {p["m"]: p for p in c["random"]}, {p["m"]: p for p in c.get("ties", [])}

        def drawn(points, m):
            return (fmt_est(points[m]["accuracy"], 100, 1), points[m]["draws"]) if m in points else ("-", 0)

        rows = [[p["m"], fmt_est(p["accuracy"], 100, 1), *drawn(ties, p["m"]), *drawn(rand, p["m"])]
                for p in c["orders"]["queue"]]
        out.append(table(["labels", "queue order: accuracy % [95% CI over test items]",
                          "queue order, ties at random: mean % [95% CI over draws]", "draws",
                          "random order: mean accuracy % [95% CI over draws]", "draws"], rows, markdown))
    return "\n".join(out)


# Each suite's renderer, ``module:function``, imported only to draw its table.
RENDERERS = {"agreement": f"{__name__}:agreement_markdown", "cost": f"{__name__}:cost_markdown",
             "injection": f"{__name__}:injection_markdown", "review": f"{__name__}:review_markdown",
             "simulate": "optim.bench.simulate.report:markdown", "latency": "optim.bench.latency:latency_markdown",
             "caching": "optim.bench.caching:caching_markdown", "batch": "optim.bench.batch:batch_markdown",
             "scale": "optim.bench.scale:scale_markdown", "startup": "optim.bench.startup:startup_markdown"}


def render_file(path: str | Path, markdown: bool = True) -> str:
    """The table of a figures JSON written by any suite."""
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    return resolve_name(RENDERERS[report["header"]["suite"]])(report, markdown)


MARKER = re.compile(r"(<!-- bench:(?P<file>[^ ]+?) -->\n)(?P<body>.*?)(<!-- /bench -->)", re.S)


def update_markdown(path: Path) -> int:
    """Replace each ``<!-- bench:FILE -->...<!-- /bench -->`` block with FILE's table (FILE relative to ``path``)."""
    text, count = MARKER.subn(lambda m: f"{m.group(1)}{render_file(path.parent / m.group('file'))}\n{m.group(4)}",
                              path.read_text(encoding="utf-8"))
    path.write_text(text, encoding="utf-8")
    return count
