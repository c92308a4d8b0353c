"""What ``chateval compile`` and ``chateval search`` print as they run: their hooks (``CompileHooks``,
``SearchHooks``) on the terminal, and the search's line per trial and trials table.

Imported by the commands' ``run()`` only: these hooks subclass the tuning and search code's own, which import DSPy,
Optuna and pandas, and the parser must not.
"""

from __future__ import annotations

import math
import sys

from optim.cli import show
from optim.search.run import SearchHooks
from optim.search.study import count
from optim.tracking.report import panel_label, trials_frame
from optim.tracking.stores import redact_url
from optim.tuning.compile import CompileHooks

TOP = 10


class CompilePrinted(CompileHooks):
    """Prints what the compile reports: a progress bar per test stage, the optimizer's progress, each summary."""

    def __init__(self, progress: bool):
        self.show_progress = progress

    def progress(self, stage: str, total: int):
        return show.progress(total, self.show_progress)

    def compiling(self, optimizer: str, n_train: int, n_dev: int) -> None:
        print(f"compiling with {optimizer} on {n_train} train / {n_dev} dev items", file=sys.stderr)

    def optimized(self, optimizer: str, metric: str, dev_scores: list) -> None:
        if dev_scores:
            print(f"{optimizer}: {len(dev_scores)} dev evaluations, best dev {metric} "
                  f"{max(v for _, v in dev_scores):.3f} (first {dev_scores[0][1]:.3f})", file=sys.stderr)

    def tested(self, stage: str, result, figures: dict, header: dict) -> None:
        from chateval_dspy.run.table import summary_table

        print(f"\n== test split, {stage} compiling ==")
        print(summary_table(figures, result.cost(), header, models=result.model_usage()))


def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def trial_line(trial, metric: str) -> str:
    """One printed line per finished trial."""
    cfg = trial.user_attrs.get("config", {})
    panel = (f"{panel_label(cfg.get('roles', []))} turns={cfg.get('turns')} {cfg.get('strategy')} "
             f"{cfg.get('aggregate')} compile={trial.user_attrs.get('compile')}")
    state = trial.state.name.lower()
    if state == "pruned":
        step = max(trial.intermediate_values) if trial.intermediate_values else None
        said = f"pruned after {step} dev items ({_fmt(trial.intermediate_values[step])})" if step else "pruned"
    else:
        figure = trial.user_attrs.get("dev", {}).get(metric) or {}
        said = f"dev {metric} {_fmt(trial.values[0])} [{_fmt(figure.get('ci_low'))}, {_fmt(figure.get('ci_high'))}]"
        if trial.user_attrs.get("agreement_undefined"):
            said = f"dev {metric} undefined (constant scores), counted as 0"
        if "cascade" in trial.user_attrs:
            said += ", " + cascade_said(trial.user_attrs["cascade"])
        elif len(trial.values) > 1:
            said += f", {trial.values[1]:,.0f} tokens/item"
    if "duplicate_of" in trial.user_attrs:
        said += f" (same panel as trial {trial.user_attrs['duplicate_of']}: not judged again)"
    return f"trial {trial.number:>3}  {said}  | {panel}"


def cascade_said(figure: dict) -> str:
    """A trial's cascade cost (``optim.tuning.cascade.CascadeCost.to_dict``), in-sample on the dev items."""
    n = (figure.get("header") or {}).get("n")
    if not figure.get("reached"):
        best = figure.get("best_level")
        return ("cascade: level not reached on dev" + (f" (best reachable {best:.1%})" if best is not None else "")
                + ", cost counted as inf")
    coverage = (figure.get("coverage") or {}).get("value")
    return (f"cascade ${figure['usd_per_1000']:.4f} per 1,000 verdicts, coverage {_fmt(coverage)} "
            f"(dev, n={n}, in-sample)")


def trials_table(study, metric: str) -> str:
    frame = trials_frame(study)
    done = frame[frame["state"].isin(["complete", "pruned"])]
    if done.empty:
        return "(no finished trials)"
    # Complete trials first: a pruned trial's value is its agreement on the items judged before it stopped.
    top = done.assign(pruned=done.state == "pruned").sort_values(
        ["pruned", "agreement", "tokens_per_item"], ascending=[True, False, True], na_position="last").head(TOP)
    shown = top.assign(
        roles=[panel_label(r.split(",")) for r in top.roles],
        **{metric: ["-" if p else f"{_fmt(a)} [{_fmt(lo)}, {_fmt(hi)}]"
                    for a, lo, hi, p in zip(top.agreement, top.ci_low, top.ci_high, top.pruned)],
           "tokens/item": [_fmt(t, 0) for t in top.tokens_per_item]},
    )[["trial", "state", "roles", "turns", "strategy", "aggregate", "compile", metric, "tokens/item", "note"]]
    title = f"top {len(top)} of {len(done)} finished trials by dev {metric}" if len(done) > TOP else \
        f"{len(done)} finished trials by dev {metric}"
    return title + "\n" + shown.to_string(index=False)


class SearchPrinted(SearchHooks):
    """Prints what the search reports: a line per trial (with a progress bar while it runs), the trials
    table, the final test's summary, and why anything was left out."""

    def __init__(self, progress: bool):
        self.enabled, self.bar, self.metric, self.dev = progress, None, "accuracy", 0

    def note(self, text: str) -> None:
        print(text, file=sys.stderr)

    def started(self, study, spec, parts) -> None:
        from chateval_dspy.run.metrics import primary_metric

        self.metric, self.dev = primary_metric(study.user_attrs["settings"]["format"]), len(parts["dev"])
        print(f"study {spec.name!r} in {redact_url(spec.storage)}: {count(study)} of {spec.trials} trials finished; "
              f"{len(parts['dev'])} dev items per trial ({'; '.join(f'{k} {len(v)}' for k, v in parts.items())})")

    def item(self, record: dict) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.dev, unit="item", leave=False, file=sys.stderr)
        self.bar.update(1)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def trial(self, study, trial) -> None:
        self._close()
        print(trial_line(trial, self.metric), flush=True)

    def waiting(self, running: int) -> None:
        print(f"waiting for {running} trial(s) still running in other workers, then testing the best panel",
              flush=True)

    def trials_done(self, study, ran, finished) -> None:
        self._close()
        print(f"\nran {len(ran)} trial(s) here; the study holds {finished} finished trial(s)\n")
        print(trials_table(study, self.metric))

    def final(self, reason: str) -> None:
        print(f"\n{reason}")

    def progress(self, total: int):
        return show.progress(total, self.enabled)

    def tested(self, trial, result, figures, header) -> None:
        from chateval_dspy.run.table import summary_table

        print(f"\n== best trial {trial.number} on the test split ==")
        print(summary_table(figures, result.cost(), header, models=result.model_usage()))
        if result.abstentions:
            print("abstentions by cause: " + ", ".join(f"{k}={v}" for k, v in result.abstentions.most_common()))
