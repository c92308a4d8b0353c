"""``chateval score``: judge a JSONL/CSV file with a saved evaluator (resumable; bad rows are listed, not fatal)."""

from __future__ import annotations

from optim.cli import flags, show


def add_command(sub) -> None:
    p = sub.add_parser("score", help="judge a JSONL/CSV file with a saved evaluator (resumable)")
    flags.add_loaded_flags(p)
    p.add_argument("--in", dest="src", required=True, help="items, .jsonl or .csv")
    p.add_argument("--out", required=True, help="verdicts .jsonl; rerunning skips ids already in it")
    p.add_argument("--columns", help="map fields to your columns, e.g. question=prompt,answer_1=a")
    p.add_argument("--no-progress", action="store_true")


def load_judge(args):
    """The saved evaluator named by the flags, bound to its LM (score, serve)."""
    from chateval_dspy.deploy.judge import load

    return load(args.evaluator, model=args.model, trust_pickle=args.trust_pickle, slots=flags.concurrency(args),
                timeout=args.timeout, served_model=args.served_model)


def run(args) -> int:
    from chateval_dspy.data.loaders import parse_columns
    from chateval_dspy.deploy.score_file import score_file

    columns = parse_columns(args.columns)
    with load_judge(args) as judge, show.progress(None, not args.no_progress) as on_item:
        report = score_file(judge, args.src, args.out, columns=columns, concurrency=args.concurrency, on_item=on_item)
    print(f"rows: {report.total}  scored now: {report.scored}  already done: {report.skipped}  "
          f"rejected: {len(report.rejected)}  -> {args.out}")
    for row, reason in report.rejected:
        print(f"  row {row}: {reason}")
    return 0
