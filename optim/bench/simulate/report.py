"""The simulation study's tables (Markdown or plain) and PNG plots, drawn from its figures JSON."""

from __future__ import annotations

from pathlib import Path

from optim.bench.markdown import table
from optim.bench.png import pyplot, save
from optim.bench.stats import fmt_est


def _est(d, digits: int = 3) -> str:
    return fmt_est(d, digits=digits) if d else "-"


def _num(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


PANEL_KNOBS = ("position_bias", "herding", "margin_right", "margin_wrong")
TUNING_KNOBS = ("demo_gain", "demo_loss", "instruction_key", "instruction_gain", "propose_rate", "ceiling")


def _knob_line(knobs: dict, names=PANEL_KNOBS, personas: bool = True) -> str:
    """The knobs a section's figures depend on."""
    acc = ", ".join(f"{slug} {p}" for slug, p in knobs["accuracy"])
    head = f"accuracy {acc} (others {knobs['default_accuracy']}); " if personas and acc else \
        f"accuracy {knobs['default_accuracy']}; "
    return head + ", ".join(f"{k} {knobs[k]}" for k in names)


def markdown(report: dict, markdown: bool = True) -> str:
    """Every section's table, each under a line stating its knobs and sizes."""
    h = report["header"]
    parts = [f"*model: {h['model']}; data: {h['data']}; seeds: {h['seeds']}; date: {h['date']}; machine: {h['machine']}; "
             f"wall: {h['wall_seconds']:.0f} s*" if markdown else f"{h['model']}; {h['data']}; wall {h['wall_seconds']:.0f} s",
             f"`{h['command']}`" if markdown else h["command"]]
    s = report["sections"]
    if "aggregation" in s:
        a = s["aggregation"]
        parts.append(f"**Aggregation** ({a['items']} test items per seed; independent: "
                     f"{_knob_line(a['knobs']['independent'], personas=False)}; herding: "
                     f"{_knob_line(a['knobs']['herding'], personas=False)})")
        rows = [[r["kind"], r["strategy"], r["turns"], r["aggregate"], r["n"], _est(r["accuracy"]), _num(r["theory"])]
                for r in a["rows"]]
        parts.append(table(["panel", "strategy", "turns", "aggregate", "referees", "accuracy [95% CI over seeds]",
                            "theory"], rows, markdown))
    if "calibration" in s:
        c = s["calibration"]
        parts.append(f"**Calibration** ({c['items']} test items per seed; {_knob_line(c['knobs'], personas=False)})")
        rows = [[r["n"], r["aggregate"], "yes" if r["calibrate"] else "no", _est(r["accuracy"]),
                 _num(r["theory_accuracy"]), _est(r["consistency"]), _num(r["theory_consistency"]),
                 _est(r["first_rate"])] for r in c["rows"]]
        parts.append(table(["referees", "aggregate", "calibrated", "accuracy [95% CI]", "theory", "consistency [95% CI]",
                            "theory", "share of verdicts 'answer 1'"], rows, markdown))
    if "compile" in s:
        c = s["compile"]
        planted = ", ".join(f"{k} {v:.2f}" for k, v in c["planted"].items())
        parts.append(f"**Compile** (1 General Public referee, 1 turn, one order; dev {c['dev']}, test {c['test']} items; "
                     f"max demos {c['max_demos']}; planted: {planted}; {_knob_line(c['knobs'], TUNING_KNOBS)})")
        rows = [[r["optimizer"], r["n_train"], _est(r["before"]), _est(r["after"]), _est(r["gain"]),
                 _est(r["demos"], 1), _est(r["keyed"], 2)] for r in c["rows"]]
        parts.append(table(["optimizer", "train labels", "test before", "test after", "gain [95% CI]", "demos",
                            "share with key phrase"], rows, markdown))
    if "labels" in s:
        rows = [[r["optimizer"], r["labels_needed"] if r["labels_needed"] is not None else f"> {max(r['tried'])}",
                 _est(r["gain_there"]), _est(r["largest_gain"])] for r in s["labels"]["rows"]]
        parts.append("**Labels needed** (fewest training labels whose gain's 95% CI lies above 0)")
        parts.append(table(["optimizer", "labels needed", "gain there", "largest gain"], rows, markdown))
    if "search" in s:
        q = s["search"]
        parts.append(f"**Search** ({q['panels']} panels in the space; test {q['test']} items; oracle: "
                     f"{'+'.join(q['oracle']['config']['roles'])}, {q['oracle']['config'].get('strategy', 'one_by_one')}, "
                     f"{q['oracle']['config'].get('aggregate', 'mean')}, expected accuracy {q['oracle']['accuracy']:.3f}; "
                     f"share of panels with the Scientist {q['strong_share_of_space']:.2f}; {_knob_line(q['knobs'])})")
        rows = [[r["dev"], r["sampler"], r["trials"], _est(r["strong_on_winner"], 2), _est(r["regret"]),
                 _est(r["winners_curse"]), _est(r["test_accuracy"])] for r in q["rows"]]
        parts.append(table(["dev items", "sampler", "trials K", "Scientist on winner [95% CI]",
                            "regret vs oracle (expected acc.)", "winner's curse (dev - expected)",
                            "winner's test accuracy"], rows, markdown))
    return "\n\n".join(parts)


def _err(d: dict) -> tuple[float, list]:
    v = d["value"]
    lo = v - d["ci_low"] if d.get("ci_low") is not None else 0
    hi = d["ci_high"] - v if d.get("ci_high") is not None else 0
    return v, [[lo], [hi]]


def plots(report: dict, directory: Path, prefix: str = "simulate") -> list[Path]:
    """PNG plots of the sections present: aggregation, compile, search."""
    plt, s, out = pyplot(), report["sections"], []
    directory.mkdir(parents=True, exist_ok=True)
    for name, draw in (("aggregation", _aggregation_plot), ("compile", _compile_plot), ("search", _search_plot)):
        if name in s:
            out.append(save(draw(s[name], plt), directory / f"{prefix}-{name}.png", plt))
    return out


def _aggregation_plot(a: dict, plt):
    """Panel accuracy against referees, measured and in theory: independent referees, and herding ones."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, kind, series in ((axes[0], "independent", ("majority", "mean")), (axes[1], "herding", None)):
        rows = [r for r in a["rows"] if r["kind"] == kind]
        groups = series or tuple(dict.fromkeys(r["strategy"] for r in rows))
        for i, g in enumerate(groups):
            pts = [r for r in rows if (r["aggregate"] if series else r["strategy"]) == g]
            for r in pts:
                v, e = _err(r["accuracy"])
                ax.errorbar([r["n"] + 0.08 * i], [v], yerr=e, fmt="o", color=f"C{i}", capsize=3)
            ax.plot([r["n"] for r in pts], [r["theory"] for r in pts], "x--", color=f"C{i}",
                    label=f"{g} (o measured, x-- theory)")
        ax.set_xlabel("referees")
        ax.set_xticks(sorted({r["n"] for r in rows}))
        ax.set_title(f"{kind} referees" + ("" if series else " (herding, 2 turns, majority)"), fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("panel accuracy (mean over seeds, 95% CI)")
    axes[0].set_ylim(0, 1)
    return fig


def _compile_plot(c: dict, plt):
    """Test accuracy after compiling against training labels, per optimizer, beside the planted levels."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, opt in enumerate(dict.fromkeys(r["optimizer"] for r in c["rows"])):
        rows = [r for r in c["rows"] if r["optimizer"] == opt]
        xs = [r["n_train"] * (1 + 0.03 * i) for r in rows]
        ax.errorbar(xs, [r["after"]["value"] for r in rows],
                    yerr=[[_err(r["after"])[1][0][0] for r in rows], [_err(r["after"])[1][1][0] for r in rows]],
                    fmt="o-", capsize=3, label=opt, color=f"C{i}")
    for name, style in (("untuned", ":"), ("demos", "-."), ("instructions", "-."), ("ceiling", "--")):
        ax.axhline(c["planted"][name], color="grey", ls=style, lw=1)
        ax.text(1.01, c["planted"][name], f"planted: {name}", transform=ax.get_yaxis_transform(), fontsize=7,
                color="grey", va="center")
    ax.set_ylim(0, 1)
    ax.set_xscale("log", base=2)
    sizes = sorted({r["n_train"] for r in c["rows"]})
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("training labels")
    ax.set_ylabel("test accuracy after compiling (95% CI over seeds)")
    ax.legend(fontsize=7)
    return fig


def _search_plot(q: dict, plt):
    """The search's winner, regret and winner's curse against trials, per dev size and sampler."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, field, label in ((axes[0], "strong_on_winner", "Scientist on the winning panel"),
                             (axes[1], "regret", "regret vs oracle (expected accuracy)"),
                             (axes[2], "winners_curse", "winner's curse: dev - expected accuracy")):
        for i, (dev, sampler) in enumerate(dict.fromkeys((r["dev"], r["sampler"]) for r in q["rows"])):
            rows = [r for r in q["rows"] if r["dev"] == dev and r["sampler"] == sampler]
            ax.errorbar([r["trials"] * (1 + 0.03 * i) for r in rows], [r[field]["value"] for r in rows],
                        yerr=[[_err(r[field])[1][0][0] for r in rows], [_err(r[field])[1][1][0] for r in rows]],
                        fmt="o-" if sampler == "tpe" else "s--", capsize=3, label=f"{sampler}, dev {dev}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["trials"] for r in q["rows"]}), [str(k) for k in sorted({r["trials"] for r in q["rows"]})])
        ax.set_xlabel("trials K")
        ax.set_title(label, fontsize=9)
    axes[0].axhline(q["strong_share_of_space"], color="grey", ls=":", lw=1, label="share of the space")
    axes[0].legend(fontsize=7)
    return fig
