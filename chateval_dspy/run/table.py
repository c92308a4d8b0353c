"""The summary a person reads after a run: agreement with CIs beside the baseline, and cost."""

from __future__ import annotations

import math

import pandas as pd

from chateval_dspy.lm.pricing import cache_rate_note, usd_text
from chateval_dspy.run.metrics import Estimate


def _fmt(value) -> str:
    if isinstance(value, Estimate):
        return str(value)
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def summary_table(metrics: dict, cost: dict, header: dict, abstentions: dict | None = None,
                  models: dict | None = None) -> str:
    """A plain-text table: what was run (model, data, split, config), agreement, cost, and abstentions.

    ``abstentions`` is ``RunResult.abstention_counts()`` (without it the totals still show) and ``models``
    ``RunResult.model_usage()`` (``model_table``). Dollar figures print as ``$0.000123`` or ``unpriced``.
    """
    lines = ["  ".join(f"{k}={v}" for k, v in header.items())]
    referee_turns = cost.get("abstained_referee_turns")
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
        # An item keeps its verdict while some referees abstain, so both counts are stated.
        # Withheld verdicts go to people: the labelled items counted here are those given a verdict (or abstained).
        among = " among the items not withheld" if "coverage" in cost else ""
        lines.append(f"items with a human label{among}: "
                     f"{metrics['n'] + (metrics['n_abstained'] if 'accuracy' not in metrics else 0)}"
                     f", abstained items: {metrics['n_abstained']}"
                     + (" (counted as disagreement)" if "accuracy" in metrics else " (left out of correlations)")
                     + (f", abstained referee turns: {referee_turns}" if referee_turns is not None else ""))
        lines += coverage_notes(metrics)
    else:
        lines += ["", "(no human labels in these items: no agreement figures; a file's label columns are named by "
                      "--columns or the task)"]
    lines += selective_lines(cost)
    cost_frame = pd.DataFrame([(k, usd_text(v) if k.startswith("cost_usd") else _fmt(v)) for k, v in cost.items()
                               if k not in SELECTIVE], columns=["cost", "value"])
    lines += ["", cost_frame.to_string(index=False)]
    if cost.get("cached_calls_per_item"):
        lines.append("(tokens and seconds count only calls that reached the LM; rerun with --no-cache for full costs)")
    if models:
        lines += ["", model_table(models)]
    table = abstention_table(abstentions) if abstentions else ""
    if table:
        lines += ["", table]
    return "\n".join(lines)


# ``RunResult.selective``'s figures: stated in words under the agreement figures, not in the cost table.
SELECTIVE = ("mean_confidence", "mean_raw_confidence", "coverage", "coverage_ci_low", "coverage_ci_high",
             "needs_person_items")


def selective_lines(cost: dict) -> list[str]:
    """The coverage of a run that withheld verdicts (with its exact 95% CI) and the mean confidence of the verdicts
    given ([] when the run has neither).

    Example:
        >>> for line in selective_lines({"items": 10, "coverage": 0.8, "coverage_ci_low": 0.444,
        ...                              "coverage_ci_high": 0.975, "needs_person_items": 2.0, "mean_confidence": 0.91}):
        ...     print(line)
        coverage (share of items given a verdict): 0.800 [0.444, 0.975] (exact 95% CI) of 10 items; 2 withheld as ...
        mean confidence of the verdicts given: 0.910 (calibrated: the expected share that people agree with)
    """
    lines = []
    if "coverage" in cost:
        lines.append(f"coverage (share of items given a verdict): {cost['coverage']:.3f} [{cost['coverage_ci_low']:.3f}, "
                     f"{cost['coverage_ci_high']:.3f}] (exact 95% CI) of {cost.get('items', '?')} items; "
                     f"{int(cost['needs_person_items'])} withheld as needs_person (confidence below the calibrated "
                     "threshold): agreement figures are over the verdicts given")
    if "mean_confidence" in cost:
        lines.append(f"mean confidence of the verdicts given: {cost['mean_confidence']:.3f} (calibrated: the expected "
                     "share that people agree with)")
    elif "mean_raw_confidence" in cost:
        lines.append(f"mean confidence of the verdicts given: {cost['mean_raw_confidence']:.3f} (raw, not calibrated: "
                     "it ranks verdicts but is no probability; chateval calibrate fits one)")
    return lines


def coverage_notes(metrics: dict) -> list[str]:
    """What the figures rest on, where it is less than every item: labels missing per criterion, averages over
    fewer criteria than the task has, and the documents and systems of summary- and system-level figures (each
    figure's own count where it is defined on fewer: its ``n``).

    Example:
        >>> coverage_notes({"fluency_missing": 3, "average_spearman_criteria": 1, "fluency_spearman": 0,
        ...                 "coherence_spearman": 0, "n_groups": 4,
        ...                 "fluency_spearman_summary": Estimate(0.5, 0.1, 0.9, 3),
        ...                 "coherence_spearman_summary": Estimate(0.4, 0.1, 0.8, 4)})  # doctest: +NORMALIZE_WHITESPACE
        ['human labels missing (items left out of that criterion): fluency 3',
         'average_spearman: over 1 of 2 criteria (the others undefined: a constant column, or no labels)',
         'summary-level (_summary): correlation within each document, averaged over those where defined:
          fluency_spearman_summary within each of 3 of 4 documents; coherence_spearman_summary within each of 4 of
          4 documents']
    """
    notes = []
    missing = {k[: -len("_missing")]: v for k, v in metrics.items() if k.endswith("_missing") and v}
    if missing:
        notes.append("human labels missing (items left out of that criterion): "
                     + ", ".join(f"{k} {v}" for k, v in missing.items()))
    for key, defined in metrics.items():
        if key.startswith("average_") and key.endswith("_criteria"):
            figure = key[: -len("_criteria")]
            stat = figure[len("average_"):]
            total = sum(k.endswith(f"_{stat}") and not k.startswith("average_") for k in metrics)
            if defined < total:
                notes.append(f"{figure}: over {defined} of {total} criteria (the others undefined: a constant "
                             "column, or no labels)")
    if "n_groups" in metrics:
        notes.append(_summary_note(metrics, metrics["n_groups"]))
    if "n_systems" in metrics:
        notes.append(f"system-level (_system): correlation of the mean scores of {metrics['n_systems']} systems")
    return notes


def _summary_note(metrics: dict, total: int) -> str:
    """The summary-level note: the documents of all, or of each figure where some figure rests on fewer."""
    used = {k: v.n for k, v in metrics.items() if k.endswith("_summary") and isinstance(v, Estimate)}
    head = "summary-level (_summary): correlation within each {}, averaged over those where defined"
    if all(n == total for n in used.values()):
        return head.format(f"of {total} documents")
    return head.format("document") + ": " + "; ".join(f"{k} within each of {n} of {total} documents"
                                                      for k, n in used.items())


def abstention_table(abstentions: dict) -> str:
    """Abstentions by cause, whole items beside referee turns ("" when there were none).

    Example:
        >>> print(abstention_table({"items": {}, "referee_turns": {"lm_error:deadline": 4, "parse_failure": 2}}))
        abstentions by cause  items  referee turns
           lm_error:deadline      0              4
               parse_failure      0              2
                       total      0              6
    """
    items, turns = abstentions.get("items") or {}, abstentions.get("referee_turns") or {}
    causes = sorted(set(items) | set(turns), key=lambda c: (-(items.get(c, 0) + turns.get(c, 0)), c))
    if not causes:
        return ""
    rows = [(c, items.get(c, 0), turns.get(c, 0)) for c in causes]
    rows.append(("total", sum(items.values()), sum(turns.values())))
    return pd.DataFrame(rows, columns=["abstentions by cause", "items", "referee turns"]).to_string(index=False)


def model_table(models: dict) -> str:
    """Calls, tokens, LM seconds and US dollars per model over the run (``RunResult.model_usage()``).

    ``cached calls`` were answered by DSPy's own cache and reached no LM. Under the table, a line for each model
    whose cached prompt tokens were priced as input for want of a cache rate.

    Example:
        >>> print(model_table({"openai/gpt-4o-mini": {"calls": 8, "cached_calls": 0, "prompt_tokens": 4000,
        ...                    "cached_prompt_tokens": 2048, "completion_tokens": 400, "seconds": 3.2,
        ...                    "cost_usd": 0.000686, "cache_rates": "read"},
        ...                    "embedded/gemma": {"calls": 8, "cached_calls": 2, "prompt_tokens": 3000,
        ...                    "completion_tokens": 300, "seconds": 9.5, "cost_usd": "unpriced"},
        ...                    "openai/gpt-4": {"calls": 1, "cached_calls": 0, "prompt_tokens": 2000,
        ...                    "cached_prompt_tokens": 1024, "completion_tokens": 10, "seconds": 0.4,
        ...                    "cost_usd": 0.001015, "cache_rates": "none"}}))
                     model  calls  cached calls  prompt tokens  cached prompt  cache write  completion tokens LM seconds       USD
        openai/gpt-4o-mini      8             0           4000           2048            0                400        3.2 $0.000686
            embedded/gemma      8             2           3000              0            0                300        9.5  unpriced
              openai/gpt-4      1             0           2000           1024            0                 10        0.4 $0.001015
        openai/gpt-4: no cache rates in LiteLLM's cost map or --price-per-mtok: 1024 cached prompt tokens priced as input
    """
    rows = [(m, f["calls"], f.get("cached_calls", 0), f["prompt_tokens"], f.get("cached_prompt_tokens") or 0,
             f.get("cache_write_tokens") or 0, f["completion_tokens"], f"{f['seconds']:.1f}", usd_text(f["cost_usd"]))
            for m, f in models.items()]
    table = pd.DataFrame(rows, columns=["model", "calls", "cached calls", "prompt tokens", "cached prompt",
                                        "cache write", "completion tokens", "LM seconds", "USD"]).to_string(index=False)
    notes = [note for m, f in models.items() if (note := cache_rate_note(m, f))]
    return "\n".join([table, *notes])
