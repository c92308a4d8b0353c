"""``chateval review``: the items the panel was least sure about, into an MLflow review queue for people to label."""

from __future__ import annotations

import argparse
import shlex
import sys

from optim.cli import flags


def add_command(sub) -> None:
    from optim.review.sizes import DEFAULT_TOP

    p = sub.add_parser("review", help="rank judged items by the panel's uncertainty and queue the most uncertain "
                                      "for human review in MLflow (then: chateval review serve, the review page)")
    p.add_argument("source", help="a results JSONL of chateval evaluate/score (its items matched to their traces), "
                                  "or mlflow:<experiment>[?filter=<trace filter>] (traced debates)")
    p.add_argument("--queue", help="the review queue's name (created if absent); required unless --no-mlflow")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--top", type=int, help=f"queue the N most uncertain traced items (default {DEFAULT_TOP})")
    how.add_argument("--budget", type=int, help="keep the queue at N items in all, adding the most uncertain new ones")
    p.add_argument("--reviewer", action="append", default=[], metavar="NAME",
                   help="a user assigned to the queue; repeat for more (MLflow allows 10)")
    p.add_argument("--task", help="the task the items were judged on (a task file or built-in name; default: the "
                                  "items' format's built-in task)")
    p.add_argument("--experiment", help="where a results file's traces are (default: chateval-dspy)")
    p.add_argument("--explain", action="store_true", help="print every ranked item's score and reasons")
    p.add_argument("--show-panel", action=argparse.BooleanOptionalAction, default=None,
                   help="the review page shows the panel's verdict before a reviewer answers (default: blind, "
                        "the verdict shown only after answering)")
    flags.add_tracking_flags(p)


def run(args) -> int:
    from chateval_dspy.errors import ConfigError
    from optim.review.queue import build_queue, rank_source
    from optim.tracking import runs as tracking

    if args.no_mlflow:
        if args.source.startswith("mlflow:"):
            raise ConfigError("--no-mlflow ranks a results file; mlflow:<experiment> needs MLflow")
        ranked, _ = rank_source(args.source, args.task)
        for r in ranked[: None if args.explain else (args.top or args.budget or 20)]:
            print(r.uncertainty.explain())
        return 0
    if not args.queue:
        raise ConfigError("name the review queue: --queue NAME (or rank only: --no-mlflow)")
    result = build_queue(args.source, queue=args.queue, task=args.task, top=args.top, budget=args.budget,
                         reviewers=args.reviewer, experiment=args.experiment, tracking_uri=args.tracking_uri,
                         show_panel=args.show_panel)
    # What became of the ranked items, and where reviewers answer.
    if args.explain:
        for r in result.ranked:
            print(f"[{r.status}] {r.uncertainty.explain()}")
    missing = result.count("no trace")
    if missing:
        print(f"{missing} of {len(result.ranked)} items have no trace and cannot be reviewed: judge them with --trace "
              "(a new --out or --overwrite: a resumed run traces only the items it judges)", file=sys.stderr)
    if len(result.origins) > 1:  # say so: a judge's rows and a dataset's items are different populations
        print("ranked debates of several origins: " + ", ".join(f"{n} from the {o}" for o, n in result.origins.items())
              + "; keep one with mlflow:<experiment>?filter=tags.`chateval.command` = 'evaluate' (or "
              "'mlflow.genai.evaluate')", file=sys.stderr)
    elsewhere = result.count("in another queue")
    print(f"review queue '{result.queue}': {len(result.added)} added, {result.count('queued')} already queued, "
          f"{result.count('answered')} already answered" + (f", {elsewhere} waiting in another queue" if elsewhere else "")
          + f"; questions: {', '.join(result.questions)}"
          + (f"; reviewers: {', '.join(result.reviewers)}" if result.reviewers else ""))
    print(f"review page: chateval review serve --queue {shlex.quote(result.queue)}"
          + (f" --experiment {shlex.quote(args.experiment)}" if args.experiment else "")
          + " (each reviewer's own link; blind to the panel until they answer)")
    print(f"MLflow's queue: {result.url}")
    uri = tracking.tracking_uri(args.tracking_uri)
    if not uri.startswith(("http://", "https://")):  # a local store has no UI until one serves it
        print(f"  (serve the store first: mlflow ui --backend-store-uri {uri})")
    return 0
