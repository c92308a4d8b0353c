"""The ``chateval`` command: one parser, one module per command, every error one line."""

from __future__ import annotations

from chateval_dspy.lm.offline import ensure_offline

ensure_offline()  # before dspy/litellm are imported by any command

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from chateval_dspy.errors import ChatEvalError  # noqa: E402
from optim.cli import (  # noqa: E402
    ablate,  # noqa: E402
    evaluate,
    report,
    review,
    review_serve,
    score,
    search,
    serve,
)
from optim.cli import compile as compile_command  # noqa: E402

COMMANDS = {"evaluate": evaluate, "compile": compile_command, "search": search, "report": report, "score": score,
            "serve": serve, "ablate": ablate, "review": review,
            "review-serve": review_serve}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chateval", description="Multi-referee debate evaluation (ChatEval) in DSPy.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every LM warning")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, set up logging, dispatch; every ChatEvalError becomes one line on stderr and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, word in enumerate(argv) if not word.startswith("-")), len(argv))
    if argv[at:at + 2] == ["review", "serve"]:  # a second verb under review; its flags are not the queue's
        argv[at:at + 2] = ["review-serve"]
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # mlflow resets its logger level when imported
        for noisy in ("dspy", "httpx", "openai", "LiteLLM", "mlflow", "alembic"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        return COMMANDS[args.command].run(args)
    except ChatEvalError as exc:
        print(f"chateval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # Ctrl-C, or SIGTERM while an MLflow run was open (optim.tracking.Terminated): the exit status a shell gives
        # a process that the signal ended, 128 + its number.
        signum = getattr(exc, "signum", signal.SIGINT)
        stopped = "terminated" if signum == signal.SIGTERM else "interrupted"
        print(f"chateval: {stopped}; finished items are in the results file", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
