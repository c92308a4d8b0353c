"""``chateval evaluate``: judge a dataset, print agreement with the human labels, log to MLflow."""

from __future__ import annotations

import sys

from optim.cli import flags, show


def add_command(sub) -> None:
    p = sub.add_parser("evaluate", help="judge a dataset and report agreement with the human labels")
    flags.add_common_flags(p)
    p.add_argument("--out", help="results JSONL, one line per item (default: results/<dataset>-<run key>.jsonl); "
                                 "rerunning the same command resumes it")
    p.add_argument("--overwrite", action="store_true", help="start --out afresh instead of resuming it")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)


def run(args) -> int:
    from chateval_dspy.run.evaluate_dataset import evaluate_dataset

    data = flags.data_spec(args)
    with show.progress(None, not args.no_progress) as on_item:
        done = evaluate_dataset(data, lambda fmt: flags.debate_config(args, fmt), flags.lm_spec(args), out=args.out,
                                overwrite=args.overwrite, concurrency=flags.concurrency(args), on_item=on_item)
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

        print(f"mlflow run: {log_evaluation(done, metrics, uri=args.tracking_uri)}")
    return 0
