"""card.md: a judge card in words for people, every value escaped, since names and paths in a card come from label
files, datasets and flags: a value can neither act (a control character, a bidi override) nor open Markdown or HTML.
"""

from __future__ import annotations

import re

import chateval_dspy.limits as limits
from chateval_dspy.deploy.saved.untrusted import COST_BY_MODEL
from chateval_dspy.lm.pricing import cache_rate_note, usd_text

# Characters that act rather than show: controls (a newline forges a line of card.md, an ESC drives a terminal),
# line and paragraph separators, and bidi overrides and isolates, which reorder what is shown ("Trojan Source").
UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What lets a value of card.md open a code span, a link, a table cell, emphasis or HTML; values never start a line
# (their newlines are escaped), so block syntax (``-``, ``#``) cannot start there.
MD_SPECIALS = re.compile(r"[\\`*\[\]|<>&]")
MD_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
# A value shown in a code span (model names, trace ids): nothing in it can end the span.
TOKEN = re.compile(r"[A-Za-z0-9._:@+/-]{1,200}")


def md_text(value, limit: int = 500) -> str:
    r"""``value`` as one line of card.md text that shows as typed: characters that act (``UNPRINTABLE``) as their
    escapes, Markdown's and HTML's specials escaped, at most ``limit`` characters of the value.

    Example:
        >>> print(md_text("ann\n- model: `openai/evil` <script>\x1b[2J"))
        ann\n- model: \`openai/evil\` &lt;script&gt;\x1b\[2J
    """
    text = str(value)
    cut = len(text) > limit
    text = MD_SPECIALS.sub(lambda m: MD_ENTITIES.get(m.group(), "\\" + m.group()), text[:limit])
    return UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text) + ("..." if cut else "")


def _code(value) -> str:
    """A trace id or similar token in a code span when it is one, else as escaped text (a backtick would end it)."""
    text = str(value)
    return f"`{text}`" if TOKEN.fullmatch(text) else md_text(text)


def _cost_lines(cost: dict) -> list[str]:
    """The card's cost block in words: the figures per item, then calls, tokens and dollars per model."""
    line = "- cost per item: " + ", ".join(
        f"{md_text(k)} {usd_text(v)}" if k.startswith("cost_usd") else f"{md_text(k)} {v:.3f}" if k.endswith("_share")
        else f"{md_text(k)} {v:.1f}" for k, v in cost.items()
        if k.startswith("cost_usd") or (isinstance(v, (int, float)) and not isinstance(v, bool)))
    if cost.get("cached_calls_per_item"):
        # A compile that keeps the original prompts meets its test calls again in the LM cache.
        line += (f" ({cost['cached_calls_per_item']:.1f} of {cost.get('calls_per_item', 0):.1f} calls per item were "
                 "answered from the LM cache, which bills no tokens: tokens and seconds count only the others)")
    lines = [line]
    for name, figures in (cost.get(COST_BY_MODEL) or {}).items():
        lines.append(f"  - {_code(name)}: {figures.get('calls', 0)} calls, {figures.get('prompt_tokens', 0)} prompt "
                     f"({figures.get('cached_prompt_tokens') or 0} cached prompt, "
                     f"{figures.get('cache_write_tokens') or 0} cache write) + "
                     f"{figures.get('completion_tokens', 0)} completion tokens, "
                     f"{usd_text(figures.get('cost_usd'))} over the test split")
        note = cache_rate_note(name, figures)
        if note:
            lines.append(f"    - {md_text(note)}")
    return lines


def _panel_lines(card: dict) -> list[str]:
    """The model, the task and the panel."""
    cfg = card["config"]
    task = cfg.get("task")
    referees = card.get("referee_models") or {}
    lines = [f"- model: {_code(card['model'])}"]
    if referees:
        lines.append(f"- referee models: {', '.join(f'{md_text(k)} {_code(v)}' for k, v in referees.items())}")
    if task:
        criteria = (f"{c['name']} {c['scale'] if isinstance(c['scale'], str) else '/'.join(map(str, c['scale']))}"
                    for c in task["criteria"])
        lines.append(f"- task: {md_text(task['name'])} ({md_text(task['format'])}); inputs "
                     f"{', '.join(md_text(i['name']) for i in task['inputs'])}; criteria {', '.join(map(md_text, criteria))}")
    lines.append(f"- panel: {', '.join(md_text(r) for r in cfg['roles'])}; strategy {md_text(cfg['strategy'])}; "
                 f"{md_text(cfg['turns'])} turn(s); aggregate {md_text(cfg['aggregate'])}; position calibration "
                 f"{'on' if cfg['calibrate'] else 'off'}")
    return lines


def _metric_lines(card: dict) -> list[str]:
    """What the card says about the data, the optimizer and the figures on the dev and test splits."""
    def figures(metrics: dict) -> str:
        return ", ".join(f"{md_text(k)} {v['value']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
                         for k, v in metrics.items() if isinstance(v, dict) and "value" in v)

    lines = [f"- {key.replace('_', ' ')}: {md_text(card[key])}"
             for key in ("dataset", "dataset_hash", "split", "optimizer", "optimizer_settings", "metric") if key in card]
    for key in ("dev_metrics", "test_metrics"):
        block = card.get(key) or {}
        stages = {s: m for s, m in block.items() if isinstance(m, dict) and "value" not in m}
        if stages:  # {"before": {...}, "after": {...}}
            for stage, metrics in stages.items():
                lines.append(f"- {key.split('_')[0]} split, {md_text(stage)} compiling: {figures(metrics)}")
        elif block:
            lines.append(f"- {key.split('_')[0]} split: {figures(block)}")
    rows = card.get("skipped_rows")
    if rows:
        lines.append(f"- malformed rows skipped: {len(rows)} (" + "; ".join(
            f"row {md_text(r.get('row'))}: {md_text(r.get('reason'), 200)}" for r in rows[:10])
            + ("; ..." if len(rows) > 10 else "") + ")")
    return lines


def _label_lines(got: dict) -> list[str]:
    """The card's ``labels``: where people's labels came from, by whom (named ones, then the others counted)."""
    who = ", ".join(f"{md_text(k, limits.MAX_LABEL_NAME_CHARS)} ({md_text(v)})"
                    for k, v in (got.get("reviewers") or {}).items())
    rest = got.get("reviewers_left_out") or {}
    if rest:
        who += (f" and {md_text(rest.get('reviewers'))} more reviewers ({md_text(rest.get('answers'))} answers; "
                "card.json names the most active)")
    traces = got.get("traces") or []
    left = got.get("traces_left_out") or 0
    sources = ", ".join(md_text(s.get("source", "?")) for s in got.get("sources", []))
    lines = [f"- people's labels: {md_text(got.get('items'))} items from {sources}; {md_text(got.get('labels'))} "
             f"answers ({md_text(got.get('from_review'))} from review, {md_text(got.get('from_files'))} from files)"
             f"{' by ' + who if who else ''}; {md_text(got.get('disagreements'))} even splits left unlabelled; "
             f"{md_text(got.get('overridden'))} labels overridden"]
    if got.get("anonymous"):
        lines.append(f"  - {md_text(got['anonymous'])} answers name no reviewer (MLflow's 'default' source) and count "
                     "as one reviewer's")
    if traces:
        lines.append(f"  - traces learned from ({len(traces) + left}): " + ", ".join(_code(t) for t in traces[:20])
                     + (", ..." if len(traces) + left > 20 else "")
                     + (f" ({md_text(left)} left out of card.json by its size limit)" if left else " (all in card.json)"))
    return lines


def _calibration_line(block: dict) -> str:
    """The card's ``calibration`` in words: the map, what it was fitted on, and the guarantee of its threshold."""
    fitted = ", ".join(f"{md_text(k)} {md_text(v)}" for k, v in block["fitted_on"].items()) or "not recorded"
    line = (f"- confidence: calibrated by a {md_text(block['method'])} map of {md_text(block['breakpoints'])} "
            f"breakpoints, fitted on {fitted}")
    if block["threshold"] is None:
        return line + "; no threshold: every verdict is given, with its calibrated confidence"
    return (line + f"; verdicts with calibrated confidence >= {block['threshold']:.4g} are given and agree with people "
            f"at least {block['level']:.1%} of the time with probability at least {1 - block['risk']:.0%} (for items "
            "drawn like the calibration items); the others abstain as needs_person")


def _figure(block: dict) -> str:
    """A certificate figure: value, 95% interval and n (``n/a`` without a value)."""
    if block["value"] is None:
        return f"n/a (n={block['n']})"
    ci = "no CI" if block["ci_low"] is None else f"{block['ci_low']:.3f}, {block['ci_high']:.3f}"
    return f"{block['value']:.3f} [{ci}] n={block['n']}"


def _certificate_lines(cert: dict) -> list[str]:
    """The card's ``certificate`` in words: each part filled, with what it was measured on, 95% intervals."""
    lines = [f"- certificate (program {_code(cert['program'])}; each figure with its 95% bootstrap interval):"]
    if "people" in cert:
        part = cert["people"]
        lines.append(f"  - people: {md_text(part['data'])}, {part['n']} items, {part['people']} people, level "
                     f"{md_text(part['level'])}; panel's results {md_text(part['results'] or 'none')}")
        lines += [f"    - among the people, {md_text(f['name'])}: {_figure(f['estimate'])}" for f in part["agreement"]]
        lines += [f"    - {md_text(r['person'])}: other people's kappa {_figure(r['people'])}, the panel's "
                  f"{_figure(r['panel'])}" for r in part["panel"]]
        if part["alt_test"] is not None:
            lines.append(f"    - alternative annotator test: {md_text(part['alt_test']['line'], 1000)}")
    if "audit" in cert:
        audit = cert["audit"]
        lines.append(f"  - bias audit: model {_code(audit['model'])}, data {md_text(audit['data'])}, {audit['n']} "
                     f"items, seed {audit['seed']}, position calibration {'on' if audit['calibrated'] else 'off'}")
        lines += [f"    - {md_text(f['probe'])} {md_text(f['figure'])}: {_figure(f['estimate'])}"
                  for f in audit["figures"]]
    if "calibration" in cert:
        part = cert["calibration"]
        lines.append(f"  - calibration error (ECE, check half): {_figure(part['ece'])}; model {_code(part['model'])}, "
                     f"data {md_text(part['data'])}, {md_text(part['split'])}")
    if "cost" in cert:
        part = cert["cost"]
        lines.append(f"  - cost per 1,000 verdicts: {usd_text(part['usd_per_1000'])}, "
                     f"{md_text(part['calls_per_1000'] if part['calls_per_1000'] is not None else 'n/a')} LM calls "
                     f"({md_text(part['source'])})")
    missing = [p for p in ("people", "audit") if p not in cert]
    if missing:
        lines.append(f"  - not measured: {', '.join(missing)} (chateval certify --program, chateval audit)")
    return lines


def card_markdown(card: dict) -> str:
    """card.md: the card in words, every value escaped (names and paths come from label files, datasets, flags)."""
    lines = [f"# Judge card: {md_text(card['config']['format'])} ChatEval evaluator", "",
             *_panel_lines(card), *_metric_lines(card)]
    if card.get("labels"):
        lines += _label_lines(card["labels"])
    if "cost" in card:
        lines += _cost_lines(card["cost"])
    if card.get("calibration"):
        lines.append(_calibration_line(card["calibration"]))
    if card.get("certificate"):
        lines += _certificate_lines(card["certificate"])
    lines.append(f"- versions: {', '.join(f'{md_text(k)} {md_text(v)}' for k, v in card['versions'].items())}")
    lines.append(f"- created: {md_text(card['created'])}")
    return "\n".join(lines) + "\n"
