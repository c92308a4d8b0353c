"""``chateval report RUN_OR_STUDY``: print a study's trials or a run's metrics, and write PNG plots."""

from __future__ import annotations

import tempfile
from pathlib import Path

from optim.cli import flags
from optim.search.study_spec import DEFAULT_STORAGE


def add_command(sub) -> None:
    p = sub.add_parser("report", help="tables and PNG plots for a search study or an MLflow run",
                       description="For a study: the trials table, agreement by panel size and turns, history, "
                                   "importances, Pareto front. For a run id: its metrics and a confusion matrix "
                                   "(pairwise) or predicted-vs-human scatter (pointwise).")
    p.add_argument("target", metavar="RUN_OR_STUDY", help="a study name (see `chateval search`) or an MLflow run id")
    p.add_argument("--storage", default=DEFAULT_STORAGE, help=f"Optuna storage URL (default {DEFAULT_STORAGE})")
    p.add_argument("--out", help="directory for the PNG files (default reports/<study or run id>)")
    flags.add_tracking_flags(p)
    for action in p._actions:  # argparse has no public way to reword a shared flag's help
        if action.dest == "no_mlflow":
            action.help = "do not attach the plots to the study's or run's MLflow run"


def run(args) -> int:
    from optim.tracking import report

    kind, found = report.find(args.target, storage=args.storage, uri=args.tracking_uri)
    out = Path(args.out or Path("reports") / args.target)
    if kind == "study":
        result = report.study_report(found, out)
        run_id = report.study_run_id(found, args.tracking_uri)
        client = report.mlflow_client(args.tracking_uri)[0] if run_id and not args.no_mlflow else None
    else:
        client, run = found
        with tempfile.TemporaryDirectory(prefix="chateval-report-") as work:
            result = report.run_report(client, run, out, Path(work))
        run_id = run.info.run_id
    print(result.title)
    print()
    print(result.table)
    for note in result.notes:
        print(f"note: {note}")
    print()
    for path in result.files:
        print(f"wrote {path}")
    if result.files and client is not None and not args.no_mlflow:
        report.attach(client, run_id, out)
        print(f"logged the plots to MLflow run {run_id} (artifacts/report)")
    return 0
