"""``chateval evaluate``: judge a dataset, print agreement with the human labels, log to MLflow."""

from __future__ import annotations

import argparse
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
    from chateval_dspy.run.evaluate_dataset import evaluate_dataset
    from optim.tracking import tracer_for

    data = flags.data_spec(args)
    panel = lambda fmt: flags.debate_config(args, fmt)  # noqa: E731 - the panel once the data's format is known
    tracer = None if args.trace is False else tracer_for(
        args.trace, items=data.items()[0], config=panel, uri=args.tracking_uri, mlflow_target=not args.no_mlflow,
        tags={"chateval.command": "evaluate"})
    with show.progress(None, not args.no_progress) as on_item:
        done = evaluate_dataset(data, panel, flags.lm_spec(args), out=args.out, overwrite=args.overwrite,
                                concurrency=flags.concurrency(args),
                                on_item=tracer.on_item(on_item) if tracer else on_item,
                                on_wave=show.wave_progress(not args.no_progress))
    if done.result.resumed:
        print(f"resumed: {done.result.resumed} item(s) were already judged in {done.out}", file=sys.stderr)
    metrics = show.summary(done.result, done.header(), data.seed)
    if done.skipped:
        print(f"skipped {len(done.skipped)} malformed row(s) of {data.dataset} (--skip-bad-rows):", file=sys.stderr)
        for error in done.skipped:
            print(f"  {error}", file=sys.stderr)
    empty = list(done.result.empty)
    if empty:
        print(f"judged {len(empty)} item(s) with an empty response (see 'empty' in their results lines): "
              f"{', '.join(map(str, empty[:10]))}{' ...' if len(empty) > 10 else ''}", file=sys.stderr)
    print(f"results: {done.out}")
    if not args.no_mlflow:
        from optim.evaluation import log_evaluation

        run_id = log_evaluation(done, metrics, uri=args.tracking_uri)
        print(f"mlflow run: {run_id}")
        if tracer:
            tracer.link_to_run(run_id)
    if tracer:
        tracer.flush()
        print(f"mlflow traces: {len(tracer.trace_ids)} (experiment {tracer.experiment_id})", file=sys.stderr)
    return 0
