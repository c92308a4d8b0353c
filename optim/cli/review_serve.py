"""``chateval review serve``: the review page over an MLflow review queue (``optim.review.server``)."""

from __future__ import annotations

import os
import sys


def add_command(sub) -> None:
    p = sub.add_parser("review-serve", prog="chateval review serve",
                       help="serve the review page of a queue (run as: chateval review serve --queue NAME)")
    p.add_argument("--queue", required=True, help="the review queue's name (made by chateval review)")
    p.add_argument("--experiment", help="the queue's experiment (default: chateval-dspy)")
    p.add_argument("--task", help="the task the items were judged on (a task file or built-in name; default: each "
                                  "trace's own built-in task)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--public-url", help="the address reviewers open, which the printed links start with (e.g. "
                                        "https://review.example.org behind a proxy; default: the bound address, "
                                        "this machine's name when bound to 0.0.0.0)")
    p.add_argument("--guidelines", metavar="FILE", help="the queue's guidelines and worked examples (Markdown), "
                                                        "shown on every item beside the task's criteria")
    p.add_argument("--token-env", default="CHATEVAL_REVIEW_TOKEN",
                   help="environment variable holding the secret the reviewers' links are keyed with (unset: a "
                        "random one, so links last until the server stops)")
    p.add_argument("--mlflow-ui", help="the MLflow UI that the links to a debate open (default: the tracking "
                                       "server, else http://127.0.0.1:5000 where mlflow ui serves a local store)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite under "
                                          "./mlruns)")


def run(args) -> int:
    import uvicorn

    from chateval_dspy.scrub import register_secret
    from optim.review.server import WILDCARD_HOSTS, create_review_app, open_reviewing, public_base

    token = os.environ.get(args.token_env) or None
    register_secret(token)  # the links' secret never reaches MLflow
    base = public_base(args.host, args.port, args.public_url)  # a bad --public-url stops before MLflow is read
    state = open_reviewing(args.queue, experiment=args.experiment, task=args.task, tracking_uri=args.tracking_uri,
                           token=token, ui=args.mlflow_ui, guidelines=args.guidelines)
    print(f"review page of queue '{state.desk.name}' ({len(state.desk.trace_ids)} items, questions: "
          f"{', '.join(q.name for q in state.desk.questions)}) on {base}; each reviewer opens their own link:")
    for user in state.desk.users:
        print(f"  {user}: {state.link(base, user)}")
    if not state.desk.users:
        print("  (no reviewer is assigned: add them with chateval review <results> --queue "
              f"{state.desk.name} --reviewer NAME)")
    print(f"the queue's owner (agreement, answers as JSONL/CSV): {state.owner_link(base)}")
    if args.host in WILDCARD_HOSTS and not args.public_url:
        print(f"(links name this machine as {base}; pass --public-url if reviewers reach it by another address)",
              file=sys.stderr)
    print("Ctrl-C stops", file=sys.stderr)
    sys.stdout.flush()
    uvicorn.run(create_review_app(state), host=args.host, port=args.port, log_level="warning")
    return 0
