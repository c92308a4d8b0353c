"""``chateval evaluate``: judge a dataset, print agreement with the human labels, log to MLflow."""

from __future__ import annotations

import argparse
import contextlib
import sys

from optim.cli import flags, show


def add_command(sub) -> None:
    p = sub.add_parser("evaluate", help="judge a dataset and report agreement with the human labels")
    flags.add_common_flags(p)
    flags.add_batch_flags(p)
    p.add_argument("--out", help="results JSONL, one line per item (default: results/<dataset>-<run key>.jsonl); "
                                 "rerunning the same command resumes it")
    p.add_argument("--overwrite", action="store_true", help="start --out afresh instead of resuming it")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)
    from chateval_dspy.run.tracing import TRACE_HELP

    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None, help=TRACE_HELP)


def run(args) -> int:
    """Judge, print the figures, and (without ``--no-mlflow``) log it all to an MLflow run that is open, RUNNING,
    from before the first item until the command ends (FINISHED, FAILED or KILLED)."""
    from chateval_dspy.run.evaluate_dataset import judge_plan, plan_run
    from optim.tracking.runs import tracer_for

    data = flags.data_spec(args)
    plan = plan_run(data, lambda fmt: flags.debate_config(args, fmt, data.task), flags.lm_spec(args), args.out)
    concurrency = flags.concurrency(args)  # flags refused before a run is opened
    tracer = None if args.trace is False else tracer_for(
        args.trace, items=plan.items, config=plan.config, uri=args.tracking_uri, mlflow_target=not args.no_mlflow,
        tags={"chateval.command": "evaluate"})
    if args.no_mlflow:
        opened = contextlib.nullcontext()
    else:
        from optim.tracking.evaluation import evaluation_run

        opened = evaluation_run(plan.data, plan.config, plan.items, out=plan.out, uri=args.tracking_uri)
    with opened as tracked:
        with show.progress(None, not args.no_progress) as on_item:
            done = judge_plan(plan, overwrite=args.overwrite, concurrency=concurrency,
                              on_item=tracer.on_item(on_item) if tracer else on_item,
                              on_wave=show.wave_progress(not args.no_progress),
                              on_start=tracked.judging if tracked is not None else None)
        metrics = _report(done)
        if tracked is not None:
            tracked.log(done, metrics)
            if tracer:
                tracer.link_to_run(tracked.run_id)
    if tracked is not None:
        print(f"mlflow run: {tracked.run_id}")
    if tracer:
        tracer.flush()
        print(f"mlflow traces: {len(tracer.trace_ids)} (experiment {tracer.experiment_id})", file=sys.stderr)
    return 0


def _report(done) -> dict:
    """Print what was judged and its figures, and what was resumed, skipped or empty; returns the metrics."""
    if done.result.resumed:
        print(f"resumed: {done.result.resumed} item(s) were already judged in {done.out}", file=sys.stderr)
    metrics = show.summary(done.result, done.header(), done.data.seed, done.data.resamples)
    if done.skipped:
        print(f"skipped {len(done.skipped)} malformed row(s) of {done.data.dataset} (--skip-bad-rows):", file=sys.stderr)
        for error in done.skipped:
            print(f"  {error}", file=sys.stderr)
    empty = list(done.result.empty)
    if empty:
        print(f"judged {len(empty)} item(s) with an empty response (see 'empty' in their results lines): "
              f"{', '.join(map(str, empty[:10]))}{' ...' if len(empty) > 10 else ''}", file=sys.stderr)
    print(f"results: {done.out}")
    return metrics
