"""``chateval ablate``: which referee earns its cost (``optim.ablation.run.ablate``): the panel whole, each referee left
out and each alone, with paired tests against the full panel, cost per item, a plot and MLflow runs."""

from __future__ import annotations

import sys

from optim.cli import flags, show


def add_command(sub) -> None:
    p = sub.add_parser("ablate", help="which referee earns its cost: the panel with each referee left out and alone",
                       description="Judges the split with the full panel, with each referee left out and with each "
                                   "referee alone, and compares each with the full panel item by item. Rerunning the "
                                   "same command resumes it: nothing already judged is judged again.")
    flags.add_common_flags(p)
    flags.add_batch_flags(p)
    p.add_argument("--out", help="folder for each variant's results file, ablation.json and ablation.png "
                                 "(default: results/ablate-<dataset>-<run key>)")
    p.add_argument("--overwrite", action="store_true", help="start every variant's results afresh instead of resuming")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)


def run(args) -> int:
    from optim.ablation.run import AblationHooks, ablate
    from optim.tracking.runs import TrackingSpec

    class Printed(AblationHooks):
        wave = staticmethod(show.wave_progress(not args.no_progress))

        def progress(self, variant, total):
            print(f"{variant.name}: {', '.join(variant.roles)}", file=sys.stderr)
            return show.progress(total, not args.no_progress)

        def judged(self, row):
            if row.result.resumed:
                print(f"  resumed: {row.result.resumed} item(s) were already judged in {row.out}", file=sys.stderr)

    data = flags.data_spec(args)
    done = ablate(data, lambda fmt: flags.debate_config(args, fmt, data.task), flags.lm_spec(args),
                  out=args.out, overwrite=args.overwrite, concurrency=flags.concurrency(args), hooks=Printed(),
                  tracking=TrackingSpec(enabled=not args.no_mlflow, uri=args.tracking_uri, log_model=False))
    print(done.table())
    print(f"\nresults: {done.out}")
    if done.plot is not None:
        print(f"plot: {done.plot}")
    if done.mlflow_run_id:
        print(f"mlflow run: {done.mlflow_run_id}")
    return 0
