"""``chateval serve``: a saved evaluator as an HTTP JSON API (loopback by default, optional bearer token)."""

from __future__ import annotations

import argparse
import os
import sys

from chateval_dspy.errors import ConfigError
from optim.cli import flags
from optim.cli.score import add_trace_flags, load_judge, traced


def add_command(sub) -> None:
    p = sub.add_parser("serve", help="serve a saved evaluator as an HTTP JSON API")
    flags.add_loaded_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token-env", default="CHATEVAL_SERVE_TOKEN",
                   help="environment variable holding the bearer token (unset: no token required)")
    p.add_argument("--queue", type=int, default=4, help="requests in flight before 503")
    p.add_argument("--max-items", type=int, default=32, help="items per request")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000)
    # Refused with a reason rather than left unknown: a batch takes hours, a request cannot wait for it.
    p.add_argument("--batch", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batch-dir", help=argparse.SUPPRESS)
    # A server judges an unbounded number of items, so the default rule never turns tracing on here.
    add_trace_flags(p, "off (a server's traffic has no size a person would read; --trace turns it on)")


def run(args) -> int:
    import uvicorn

    from chateval_dspy.deploy.serving.http import create_app
    from chateval_dspy.scrub import register_secret

    if args.batch or args.batch_dir:
        raise ConfigError("serve answers each request live: batch mode (--batch, --batch-dir) is for evaluate, "
                          "score and ablate, whose items can wait hours for their waves")
    token = os.environ.get(args.token_env) or None
    register_secret(token)  # whatever the variable's name, the token never reaches MLflow
    with load_judge(args) as judge:
        evaluator = traced(judge, args, items=None, command="serve")
        app = create_app(evaluator, token=token, max_body_bytes=args.max_body_bytes, max_items=args.max_items,
                         queue=args.queue, concurrency=args.concurrency)
        print(f"serving {args.evaluator} on http://{args.host}:{args.port} "
              f"({'bearer token required' if token else 'no token'}"
              f"{'; each item traced to MLflow' if evaluator is not judge else ''}); Ctrl-C stops", file=sys.stderr)
        try:
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        finally:
            if evaluator is not judge:
                evaluator.tracer.flush()
    return 0
