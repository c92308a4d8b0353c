"""Tables and plots for a search study or an MLflow run (matplotlib with the Agg backend).

A study gets its trials table and PNGs: agreement against panel size and turns (the
paper's Figure 3), the optimisation history, parameter importances, the intermediate
values that drove pruning, and the Pareto front of a two-objective study. A run gets its
metrics table and, from its results JSONL, a confusion matrix (pairwise) or a scatter
of predicted against human scores per aspect (pointwise).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.roles import DEFAULT_ORDER
from chateval_dspy.run.metrics import primary_metric

PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
PAIRWISE_LABELS = ["1", "2", "tie", "abstain"]


@dataclass
class Report:
    """What a report printed and wrote: the table, the PNG files, and notes on what could not be drawn."""

    title: str
    table: str
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, files: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    files.append(path)


def _sqlite_missing(url: str) -> bool:
    """A sqlite URL whose file does not exist (opening it would create an empty store)."""
    from optim.tracking.stores import sqlite_path

    path = sqlite_path(url)
    return path is not None and not path.exists()


def mlflow_client(uri: str | None):
    """An MLflow client on the tracking store, or None when the default local store was never created."""
    from optim.tracking import runs as tracking

    resolved = tracking.tracking_uri(uri)
    if _sqlite_missing(resolved):
        return None, resolved
    import mlflow

    # runs.py has no read helpers (get a run, list, download and attach artifacts): the client does that here.
    return mlflow.MlflowClient(resolved), resolved


def find(target: str, *, storage: str, uri: str | None = None):
    """``("study", study)`` or ``("run", (client, run))`` for ``target``, else a ConfigError saying what exists.

    Example:
        >>> find("no-such-study", storage=f"sqlite:///{tmp}/optuna.db")
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: no study named 'no-such-study' (studies in sqlite:///.../optuna.db: none); ...
    """
    import optuna

    from optim.tracking.stores import redact_url

    known = [] if _sqlite_missing(storage) else sorted(optuna.get_all_study_names(storage=storage))
    if target in known:
        return "study", optuna.load_study(study_name=target, storage=storage)
    where = f"studies in {redact_url(storage)}: {', '.join(known) if known else 'none'}"
    if RUN_ID.match(target):
        client, resolved = mlflow_client(uri)
        if client is None:
            raise ConfigError(f"no study or MLflow run {target!r}: there is no MLflow store at {resolved} ({where})")
        import mlflow

        try:
            return "run", (client, client.get_run(target))
        except mlflow.exceptions.MlflowException as exc:
            raise ConfigError(f"no study or MLflow run {target!r}: the run is not in {resolved} ({where})") from exc
    raise ConfigError(f"no study named {target!r} ({where}); an MLflow run id is 32 hex characters, "
                      "as printed on a command's 'mlflow run:' line")


def trials_frame(study):
    """One row per trial: state, panel, turns, strategy, aggregate, compile, dev agreement with CI, tokens per item."""
    import pandas as pd

    metric = None
    rows = []
    for t in study.get_trials(deepcopy=False):
        cfg = t.user_attrs.get("config") or {}
        dev = t.user_attrs.get("dev") or {}
        metric = metric or next((k for k in map(primary_metric, ("pairwise", "pointwise")) if k in dev), None)
        figure = dev.get(metric) if metric else None
        cost = t.user_attrs.get("cost") or {}
        tokens = cost.get("prompt_tokens_per_item", math.nan) + cost.get("completion_tokens_per_item", math.nan)
        share = cost.get("cached_prompt_share")
        rows.append({
            "trial": t.number, "state": t.state.name.lower(),
            "roles": ",".join(cfg.get("roles", [])), "n_roles": len(cfg.get("roles", [])) or None,
            "turns": cfg.get("turns"), "strategy": cfg.get("strategy"), "aggregate": cfg.get("aggregate"),
            "compile": t.user_attrs.get("compile"),
            "agreement": t.values[0] if t.values else math.nan,
            "ci_low": figure["ci_low"] if figure else math.nan, "ci_high": figure["ci_high"] if figure else math.nan,
            "tokens_per_item": tokens,
            "cached_prompt_share": share if isinstance(share, (int, float)) else math.nan,
            "note": _note(t),
        })
    return pd.DataFrame(rows)


def panel_label(roles) -> str:
    """A short name for a panel in printed tables.

    Example:
        >>> panel_label(["referee_1", "referee_2"]), panel_label(DEFAULT_ORDER)
        ('same-role x2', 'all five')
    """
    roles = list(roles)
    if roles and all(r.startswith("referee_") for r in roles):
        return f"same-role x{len(roles)}"
    if roles == list(DEFAULT_ORDER):
        return "all five"
    return ",".join(roles)


def _note(t) -> str:
    notes = []
    if "duplicate_of" in t.user_attrs:
        notes.append(f"same as #{t.user_attrs['duplicate_of']}")
    if t.user_attrs.get("agreement_undefined"):
        notes.append("undefined->0")
    if t.state.name == "PRUNED" and t.intermediate_values:
        step = max(t.intermediate_values)
        notes.append(f"pruned at {step} items ({t.intermediate_values[step]:.3f})")
    if t.user_attrs.get("surplus"):
        notes.append("surplus")
    return ", ".join(notes)


def study_table(study) -> str:
    frame = trials_frame(study)
    if frame.empty:
        return "(the study has no trials)"
    frame = frame.assign(roles=[panel_label(r.split(",")) if r else "" for r in frame.roles],
                         tokens_per_item=[f"{t:.0f}" if t == t else "-" for t in frame.tokens_per_item])
    # A study run without the provider's prompt cache (or before it was counted) keeps the table it always had.
    dropped = ["n_roles"] + ([] if (frame.cached_prompt_share.fillna(0) > 0).any() else ["cached_prompt_share"])
    return frame.drop(columns=dropped).to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")


def figure3(study, path: Path, files: list[Path]) -> None:
    """Agreement against panel size and against turns, one line (mean) and dots (trials) per strategy."""
    import pandas as pd

    from chateval_dspy.program.strategies import STRATEGIES

    frame = trials_frame(study)
    frame = frame[frame.state == "complete"]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colors = {s: f"C{i}" for i, s in enumerate(STRATEGIES)}
    for ax, column, label in ((axes[0], "n_roles", "number of referees"), (axes[1], "turns", "discussion turns")):
        for strategy, rows in frame.dropna(subset=[column]).groupby("strategy"):
            color = colors.get(strategy, "C9")
            ax.scatter(rows[column], rows["agreement"], alpha=0.3, s=18, color=color)
            means = rows.groupby(column)["agreement"].mean()
            ax.plot(means.index, means.values, marker="o", label=strategy.replace("_", " "), color=color)
        ax.set_xlabel(label)
        ax.set_xticks(sorted(pd.unique(frame[column].dropna())))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"dev agreement ({_metric_name(study)})")
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(f"{study.study_name}: agreement by panel size and turns (cf. ChatEval Figure 3)\n"
                 "lines: mean over complete trials; other dimensions vary", fontsize=10)
    _save(fig, path, files)


def _metric_name(study) -> str:
    settings = study.user_attrs.get("settings", {})
    return "average Spearman" if settings.get("format") == "pointwise" else "accuracy"


def _importances(study, path: Path, files: list[Path], target_name: str) -> str:
    """Plot parameter importances for agreement; returns the line to print."""
    import optuna
    from optuna.visualization import matplotlib as vis

    values = {t.values[0] for t in study.get_trials(deepcopy=False) if t.values}
    if len(values) < 2:
        return "parameter importances: every complete trial has the same agreement, so no parameter explains it"
    # The default evaluator ranks what leads to *low* targets when given one: negate agreement (importance is
    # about which parameters matter, so the sign does not change the picture, only which tail is studied).
    target = None if len(study.directions) == 1 else (lambda t: -t.values[0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            importances = optuna.importance.get_param_importances(study, target=target)
            ax = vis.plot_param_importances(study, target=target, target_name=target_name)
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        return f"parameter importances could not be computed: {exc}"
    _save(ax.figure, path, files)
    return "parameter importances: " + ", ".join(f"{k} {v:.2f}" for k, v in importances.items())


SECOND_OBJECTIVE = {"tokens": "tokens per dev item",
                    "cascade_cost": "cascade USD per 1,000 verdicts (dev, in-sample; inf: level not reached)"}


def study_report(study, out: Path) -> Report:
    """Write the study's PNGs under ``out`` and return the table, files and notes."""
    import optuna
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as vis

    out = Path(out)
    files: list[Path] = []
    notes: list[str] = []
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    # Optuna's plots of a two-objective study need a target: agreement, the first.
    target = None if len(study.directions) == 1 else (lambda t: t.values[0])
    target_name = f"dev {_metric_name(study)}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the matplotlib backend is "experimental"
        if complete:
            figure3(study, out / "agreement_vs_roles_turns.png", files)
            ax = vis.plot_optimization_history(study, target=target, target_name=target_name)
            _save(ax.figure, out / "optimization_history.png", files)
        else:
            notes.append("no complete trials: no agreement or history plot")
        if len(complete) < 2:
            notes.append(f"parameter importances need at least 2 complete trials; the study has {len(complete)}")
        else:
            notes.append(_importances(study, out / "param_importances.png", files, target_name))
        if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
            ax = vis.plot_intermediate_values(study)
            ax.set_xlabel("dev items judged")
            ax.set_ylabel("dev agreement so far")
            _save(ax.figure, out / "intermediate_values.png", files)
        if len(study.directions) == 2:
            # The second objective as the study recorded it: tokens, or a cascade's dollars (optim.search.space).
            second = ((study.user_attrs.get("settings") or {}).get("objectives") or ["agreement", "tokens"])[-1]
            if complete:
                ax = vis.plot_pareto_front(study, target_names=[target_name, SECOND_OBJECTIVE.get(second, second)])
                _save(ax.figure, out / "pareto_front.png", files)
            pareto = ", ".join(str(t.number) for t in sorted(study.best_trials, key=lambda t: t.number))
            notes.append(f"Pareto front (agreement vs {second}): trials {pareto or 'none'}")
    final = study.user_attrs.get("final")
    if final:
        notes.append(f"best trial {final['trial']} was tested and saved in {final['out']}")
    title = f"study {study.study_name}: {len(study.trials)} trials, {len(complete)} complete, objectives " \
            f"{'+'.join(d.name.lower() for d in study.directions)}"
    return Report(title, study_table(study), files, notes)


def study_run_id(study, uri: str | None) -> str | None:
    """The study's MLflow parent run in this tracking store, if one was recorded."""
    from optim.tracking import runs as tracking
    from optim.tracking.stores import redact_url

    return (study.user_attrs.get("mlflow_runs") or {}).get(redact_url(tracking.tracking_uri(uri)))


def metrics_table(run) -> str:
    """The run's metrics, with 95% CIs beside each figure that has them."""
    import pandas as pd

    metrics = run.data.metrics
    rows = []
    for key in metrics:
        if key.endswith(("_ci_low", "_ci_high")):
            continue
        low, high = metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
        ci = f"[{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        value = metrics[key]
        shown = f"{value:.0f}" if float(value).is_integer() and not ci else f"{value:.3f}"
        rows.append((key, shown, ci))
    if not rows:
        return "(the run has no metrics)"
    # Grouped by prefix (test_before., dev. ...), figures with a CI (agreement) before cost and counts.
    rows.sort(key=lambda r: (r[0].rpartition(".")[0], not r[2], r[0]))
    return pd.DataFrame(rows, columns=["metric", "value", "95% CI"]).to_string(index=False)


def _run_header(run) -> str:
    p, tags = run.data.params, run.data.tags
    keys = ("model", "dataset", "split", "limit", "config.format", "config.roles", "config.strategy", "config.turns",
            "config.aggregate", "optimizer", "study", "trial", "compile")
    shown = "  ".join(f"{k.removeprefix('config.')}={p[k]}" for k in keys if k in p)
    return f"run {run.info.run_id} ({run.info.run_name}, {tags.get('command', 'trial' if 'trial' in p else '?')}, " \
           f"{run.info.status.lower()})\n{shown}"


def result_files(client, run_id: str, dest: Path) -> list[Path]:
    """Download the run's results JSONL files (those under ``results/`` first, else any)."""
    def walk(path=None):
        for entry in client.list_artifacts(run_id, path):
            if entry.is_dir:
                yield from walk(entry.path)
            elif entry.path.endswith(".jsonl"):
                yield entry.path

    found = list(walk())
    chosen = [p for p in found if p.startswith("results/")] or found
    with mock.patch.dict(os.environ, {PROGRESS_BAR: "false"}):  # MLflow's download bar would land in the report
        return [Path(client.download_artifacts(run_id, p, str(dest))) for p in chosen]


def confusion(records: list[dict], path: Path, files: list[Path], title: str) -> None:
    """Human label (rows) against the panel's verdict (columns); abstentions are their own column."""
    from sklearn.metrics import ConfusionMatrixDisplay, confusion_matrix

    labelled = [r for r in records if r.get("human") is not None]
    human = [r["human"] for r in labelled]
    said = [r["prediction"] if r.get("prediction") is not None else "abstain" for r in labelled]
    matrix = confusion_matrix(human, said, labels=PAIRWISE_LABELS)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    shown = ConfusionMatrixDisplay(matrix, display_labels=PAIRWISE_LABELS).plot(ax=ax, colorbar=False, cmap="Blues")
    for text in shown.text_[-1]:  # people never abstain: drop that row, keep the panel's abstention column
        text.remove()
    ax.set_ylim(len(PAIRWISE_LABELS) - 1.5, -0.5)
    ax.set_xlabel("panel's verdict")
    ax.set_ylabel("human label")
    accuracy = sum(h == s for h, s in zip(human, said)) / max(len(human), 1)
    ax.set_title(f"{title}\naccuracy {accuracy:.3f} over {len(human)} items", fontsize=9)
    _save(fig, path, files)


def scatter(records: list[dict], path: Path, files: list[Path], title: str) -> None:
    """Predicted against human score per integer-scale criterion (Topical-Chat's four aspects), with its Spearman."""
    from chateval_dspy.run.metrics import spearman

    pairs = [(r["human"], r["prediction"]) for r in records if r.get("human") and r.get("prediction")]
    names = [k for k, v in pairs[0][1].items() if isinstance(v, (int, float))] if pairs else []
    plt = _pyplot()
    rows = max(1, math.ceil(len(names) / 2))
    fig, axes = plt.subplots(rows, 2, figsize=(8, 3.5 * rows), squeeze=False)
    for ax, aspect in zip(axes.flat, names):
        given = [(x[aspect], y[aspect]) for x, y in pairs if x.get(aspect) is not None]
        h = [float(a) for a, _ in given]
        p = [float(b) for _, b in given]
        ax.scatter(h, p, alpha=0.6, s=20)
        rho = spearman(h, p) if len(h) > 1 else math.nan
        ax.set_title(f"{aspect}: Spearman {'n/a' if math.isnan(rho) else f'{rho:.3f}'}", fontsize=9)
        ax.set_xlabel("human (mean)")
        ax.set_ylabel("panel")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: {len(pairs)} items with a verdict", fontsize=10)
    _save(fig, path, files)


def model_cost_table(records: list[dict]) -> str:
    """Calls, tokens (cached and cache-written among the prompt tokens), seconds and dollars per model over a
    results file's lines (``run.table.model_table``); "" when no line carries per-model usage.

    Example:
        >>> print(model_cost_table([{"id": 1, "usage_by_model": {"openai/gpt-4o-mini": {
        ...     "calls": 2, "prompt_tokens": 10000, "cached_prompt_tokens": 6000, "completion_tokens": 500,
        ...     "seconds": 1.0, "cost_usd": 0.00135, "cache_rates": "read"}}}]))
                     model  calls  cached calls  prompt tokens  cached prompt  cache write  completion tokens LM seconds       USD
        openai/gpt-4o-mini      2             0          10000           6000            0                500        1.0 $0.001350
    """
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.run.result import RunResult
    from chateval_dspy.run.table import model_table

    result = RunResult(DebateConfig())
    for record in records:
        if isinstance(record.get("usage_by_model"), dict) and not record.get("error"):
            result.add_usage(record["usage_by_model"])
    return model_table(result.model_usage()) if result.models else ""


def run_report(client, run, out: Path, workdir: Path) -> Report:
    """The run's metrics table, its cost per model from each results file, and one plot per results file."""
    out = Path(out)
    files: list[Path] = []
    notes: list[str] = []
    tables = [metrics_table(run)]
    downloaded = result_files(client, run.info.run_id, workdir)
    if not downloaded:
        notes.append("the run has no results JSONL artifact: no confusion matrix or scatter")
    for path in downloaded:
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not records:
            notes.append(f"{path.name} is empty")
            continue
        by_model = model_cost_table(records)
        if by_model:
            tables.append(f"cost by model ({path.name}):\n{by_model}")
        if records[0].get("format") == "pairwise":
            confusion(records, out / f"confusion_{path.stem}.png", files, path.stem)
        else:
            scatter(records, out / f"scatter_{path.stem}.png", files, path.stem)
    return Report(_run_header(run), "\n\n".join(tables), files, notes)


def attach(client, run_id: str, out: Path, artifact_dir: str = "report") -> None:
    """Add the report's files to an MLflow run (any state: a finished run keeps its status)."""
    client.log_artifacts(run_id, str(out), artifact_dir)
