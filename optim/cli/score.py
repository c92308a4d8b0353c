"""``chateval score``: judge a JSONL/CSV file with a saved evaluator (resumable; bad rows are listed, not fatal)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chateval_dspy.errors import ConfigError
from optim.cli import flags, show


def add_trace_flags(p: argparse.ArgumentParser, default_rule: str) -> None:
    """``--trace/--no-trace`` and ``--tracking-uri`` (score, serve)."""
    from chateval_dspy.run.tracing import DEFAULT_MAX_ITEMS

    g = p.add_argument_group("tracing")
    g.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                   help=f"log each judged item as an MLflow trace (answer orders, rounds, referee turns). "
                        f"Default: {default_rule.format(n=DEFAULT_MAX_ITEMS)}")
    g.add_argument("--tracking-uri", help="MLflow tracking URI for traces (default: $MLFLOW_TRACKING_URI or sqlite "
                                          "under ./mlruns)")


def add_command(sub) -> None:
    p = sub.add_parser("score", help="judge a JSONL/CSV file with a saved evaluator (resumable)")
    flags.add_loaded_flags(p)
    flags.add_batch_flags(p)
    p.add_argument("--in", dest="src", required=True, help="items, .jsonl or .csv")
    p.add_argument("--out", required=True, help="verdicts .jsonl; rerunning skips ids already in it")
    p.add_argument("--columns", help="map fields to your columns, e.g. question=prompt,answer_1=a")
    p.add_argument("--no-progress", action="store_true")
    add_trace_flags(p, "on when MLflow is the tracking target (--tracking-uri or $MLFLOW_TRACKING_URI) and the "
                       "file has at most {n} rows")


def load_judge(args):
    """The saved evaluator named by the flags, bound to the LM the flags give (score, serve); in batch mode
    (``--batch``, ``--batch-dir``: score only) its batches are kept beside ``--out``."""
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.run.evaluate_dataset import journal_folder

    lm = flags.lm_spec(args)
    batched = {"journal": journal_folder(Path(args.out)), "on_wave": show.wave_progress(not args.no_progress)} \
        if lm.batch else {}
    return load(args.evaluator, lm=lm, slots=flags.concurrency(args), trust_pickle=args.trust_pickle, **batched)


def traced(judge, args, *, items: int | None, command: str, tags: dict | None = None):
    """``judge`` wrapped so each item becomes an MLflow trace when the tracing rule says so, else ``judge``."""
    from chateval_dspy.run.tracing import tracing_default
    from optim.tracking import runs as tracking

    cascade = hasattr(judge, "stages")  # a trace follows one panel's debate; a cascade runs several
    if args.trace and cascade:
        raise ConfigError(f"{args.evaluator} is a cascade: --trace follows one panel's debate; score without it")
    if cascade or not tracing_default(args.trace, mlflow_target=tracking.tracking_targeted(args.tracking_uri),
                                      items=items):
        return judge
    from chateval_dspy.deploy.mlflow.traced import TracedJudge
    from chateval_dspy.deploy.scale.parts import judge_run_key
    from chateval_dspy.run.tracing import Tracer

    experiment_id = tracking.start_tracing(args.tracking_uri)
    # The run key its results lines carry, so that chateval review finds each line's trace.
    tracer = Tracer(judge.config, roles=getattr(judge.program, "roles", None), model=judge.lm.model,
                    tags={"chateval.command": command, "chateval.run_key": judge_run_key(judge), **(tags or {})},
                    experiment_id=experiment_id)
    return TracedJudge(judge, tracer)


def run(args) -> int:
    from chateval_dspy.data.loaders import parse_columns
    from chateval_dspy.deploy.scale.score_file import score_file
    from chateval_dspy.run.tracing import DEFAULT_MAX_ITEMS, at_most_lines

    columns = parse_columns(args.columns)
    # The default rule counts rows only when it could turn tracing on (an upper bound: non-blank lines).
    small = args.trace is None and Path(args.src).is_file() and at_most_lines(args.src, DEFAULT_MAX_ITEMS)
    with load_judge(args) as judge, show.progress(None, not args.no_progress) as on_item:
        evaluator = traced(judge, args, items=DEFAULT_MAX_ITEMS if small else None, command="score",
                           tags={"chateval.source": Path(args.src).name})
        report = score_file(evaluator, args.src, args.out, columns=columns, concurrency=args.concurrency,
                            on_item=on_item, waves=bool(args.batch or args.batch_dir))
        if evaluator is not judge:
            evaluator.tracer.flush()
    print(f"rows: {report.total}  scored now: {report.scored}  already done: {report.skipped}  "
          f"rejected: {len(report.rejected)}  -> {args.out}")
    for row, reason in report.rejected:
        print(f"  row {row}: {reason}")
    if evaluator is not judge:
        print(f"mlflow traces: {len(evaluator.tracer.trace_ids)} (experiment {evaluator.tracer.experiment_id})",
              file=sys.stderr)
    return 0
