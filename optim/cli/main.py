"""The ``chateval`` command: one parser, one module per command, every error one line."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from chateval_dspy.errors import ChatEvalError
from chateval_dspy.lm.offline import ensure_offline

# Command -> its module: a parser declaration (light imports only) and a run() that imports what it needs.
COMMANDS = {name: "optim.cli." + name.replace("-", "_") for name in (
    "evaluate", "compile", "search", "report", "score", "serve", "ablate", "review", "review-serve", "calibrate",
    "cascade", "audit", "certify")}


def command(name: str):
    """The module of command ``name`` (imported on first use)."""
    return importlib.import_module(COMMANDS[name])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chateval", description="Multi-referee debate evaluation (ChatEval) in DSPy.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every LM warning")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        command(name).add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, set up logging, dispatch; every ChatEvalError becomes one line on stderr and exit 2."""
    ensure_offline()  # this process is ours: before any command imports dspy/litellm/mlflow
    # MLflow draws a progress bar for every artifact it reads back (DSPy autolog does, per optimizer step),
    # which interleaves with the command's own progress.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
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
        return command(args.command).run(args)
    except ChatEvalError as exc:
        print(f"chateval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # Ctrl-C, or SIGTERM while an MLflow run was open (optim.tracking.runs.Terminated): the exit status a shell gives
        # a process that the signal ended, 128 + its number.
        signum = getattr(exc, "signum", signal.SIGINT)
        stopped = "terminated" if signum == signal.SIGTERM else "interrupted"
        print(f"chateval: {stopped}; finished items are in the results file", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
