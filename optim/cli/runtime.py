"""``chateval``: a thin command line over the Python API (flags -> DebateConfig -> evaluate)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from chateval_dspy.lm.offline import ensure_offline

ensure_offline()  # before dspy/litellm are imported anywhere below

from chateval_dspy.errors import ChatEvalError, ConfigError  # noqa: E402


def _add_panel_flags(p: argparse.ArgumentParser) -> None:
    from chateval_dspy.program.strategies import STRATEGIES

    g = p.add_argument_group("panel")
    who = g.add_mutually_exclusive_group()
    who.add_argument("--roles", type=int, metavar="N", help="use the first N built-in personas (1-5; default 2)")
    who.add_argument("--role", action="append", metavar="SLUG", help="a persona by slug; repeat for more referees")
    who.add_argument("--same-role", type=int, metavar="N", help="N referees sharing one persona (the paper's ablation)")
    g.add_argument("--role-file", help="YAML/JSON file of extra personas (see chateval_dspy/roles/default.yaml)")
    g.add_argument("--strategy", default="one_by_one", choices=list(STRATEGIES))
    g.add_argument("--turns", type=int, default=2, help="rounds of talk; the last is the verdict (default 2)")
    g.add_argument("--aggregate", default="mean", choices=["mean", "majority"])
    g.add_argument("--no-calibrate", action="store_true", help="pairwise: judge one answer order only")
    g.add_argument("--consensus-stop", action="store_true",
                   help="every round ends in scores; stop once all referees agree (fewer LM calls)")
    g.add_argument("--weighted-scores", action="store_true",
                   help="G-Eval style: expected score under the LM's token probabilities (needs an LM with logprobs)")
    g.add_argument("--parse-retries", type=int, default=1)
    g.add_argument("--max-text-chars", type=int, default=6000, help="judged texts longer than this are truncated")


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--dataset", required=True, help="faireval, topical_chat, or a .jsonl/.csv file of your own")
    g.add_argument("--format", choices=["pairwise", "scoring"], help="the format of a custom file")
    g.add_argument("--columns", help="custom file: map fields to your columns, e.g. question=prompt,answer_1=a,label=winner")
    g.add_argument("--split", default="all", choices=["all", "train", "dev", "test"])
    g.add_argument("--seed", type=int, default=0, help="split and bootstrap seed")
    g.add_argument("--limit", type=int, help="judge only the first N items of the split")


def _add_lm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="embedded",
                   help="embedded (default: Gemma 3 270M, started for you), an OpenAI-compatible base URL, "
                        "or a LiteLLM model string such as openai/gpt-4o-mini")
    g.add_argument("--served-model", help="model id at a base URL (default: the first it lists)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--max-tokens", type=int)
    g.add_argument("--timeout", type=float, default=120.0, help="seconds per LM request")
    g.add_argument("--concurrency", type=int, default=1, help="items judged at once")
    g.add_argument("--no-cache", action="store_true", help="turn DSPy's LM cache off")
    g.add_argument("--cache-dir", help="DSPy cache directory (default: $CHATEVAL_CACHE_DIR or ~/.cache/chateval-dspy)")


def add_common_flags(p: argparse.ArgumentParser) -> None:
    """Data, panel and model flags, shared by every command that judges items."""
    _add_data_flags(p)
    _add_panel_flags(p)
    _add_lm_flags(p)


def build_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The runtime commands; ``optim.cli.main`` adds compile, search and report to the same parser."""
    parser = argparse.ArgumentParser(prog="chateval", description="Multi-referee debate evaluation (ChatEval) in DSPy.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every LM warning")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help="judge a dataset and report agreement with the human labels")
    add_common_flags(ev)
    ev.add_argument("--out", help="results JSONL, one line per item (default: results/<dataset>-<run key>.jsonl); "
                                  "rerunning the same command resumes it")
    ev.add_argument("--overwrite", action="store_true", help="start --out afresh instead of resuming it")
    ev.add_argument("--no-progress", action="store_true")

    def add_loaded(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("evaluator", help="saved evaluator dir, runs:/<run_id>[/path] or models:/<name>/<version>")
        p.add_argument("--model", help="LM for this evaluator (default: the card's model)")
        p.add_argument("--served-model", help="model id at a base URL")
        p.add_argument("--timeout", type=float, default=120.0, help="seconds per LM request")
        p.add_argument("--concurrency", type=int, default=2, help="items judged at once")
        p.add_argument("--trust-pickle", action="store_true", help="allow a pickled program (runs code from the file)")
        return p

    sc = add_loaded("score", "judge a JSONL/CSV file with a saved evaluator (resumable)")
    sc.add_argument("--in", dest="src", required=True, help="items, .jsonl or .csv")
    sc.add_argument("--out", required=True, help="verdicts .jsonl; rerunning skips ids already in it")
    sc.add_argument("--columns", help="map fields to your columns, e.g. question=prompt,answer_1=a")
    sc.add_argument("--no-progress", action="store_true")
    sv = add_loaded("serve", "serve a saved evaluator as an HTTP JSON API")
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--token-env", default="CHATEVAL_SERVE_TOKEN",
                    help="environment variable holding the bearer token (unset: no token required)")
    sv.add_argument("--queue", type=int, default=4, help="requests in flight before 503")
    sv.add_argument("--max-items", type=int, default=32, help="items per request")
    sv.add_argument("--max-body-bytes", type=int, default=1_000_000)
    return parser, sub


def config_from_args(args, fmt: str):
    """Flags -> DebateConfig (the CLI's only translation step)."""
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.program.roles import first_roles, same_roles

    if args.same_role is not None:
        if args.same_role < 1:
            raise ConfigError(f"--same-role takes a positive number, got {args.same_role}")
        roles = same_roles(args.same_role)
    elif args.role:
        roles = tuple(args.role)
    else:
        roles = first_roles(args.roles if args.roles is not None else 2)
    return DebateConfig(format=fmt, roles=roles, strategy=args.strategy, turns=args.turns,
                        calibrate=not args.no_calibrate, aggregate=args.aggregate, parse_retries=args.parse_retries,
                        max_text_chars=args.max_text_chars, role_file=args.role_file,
                        consensus_stop=args.consensus_stop, weighted_scores=args.weighted_scores)


def run_key(args, cfg, items) -> str:
    """What makes two runs the same run: config, model flags and the exact items (a resumed run must match)."""
    import hashlib
    import json

    from chateval_dspy.data.loaders import dataset_hash

    key = {"config": cfg.changes(), "model": args.model, "served_model": args.served_model,
           "temperature": args.temperature, "max_tokens": args.max_tokens, "items": dataset_hash(items)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _out_path(args, key: str) -> Path:
    """``--out`` or ``results/<dataset>-<run key>.jsonl``: the same command finds its own file again and resumes."""
    if args.out:
        path = Path(args.out)
    else:
        stem = Path(args.dataset).stem if Path(args.dataset).suffix else args.dataset
        path = Path("results") / f"{stem}-{key}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if args.overwrite and path.exists():
        path.write_text("", encoding="utf-8")
    from chateval_dspy.run.evaluate import finished_records

    finished_records(path, key)  # a foreign or malformed file fails here, before any model starts
    return path


def lm_context(args, cfg):
    """The LM named by the flags, entered with the JSON adapter (a context manager yielding the LM)."""
    import contextlib

    import dspy

    from chateval_dspy.lm.adapter import JudgeAdapter
    from chateval_dspy.lm.resolve import configure_cache, resolve_lm

    configure_cache(not args.no_cache, args.cache_dir)
    # Requests in flight: items at once (an optimizer's --threads counts too), times the referees who talk at once.
    at_once = max(args.concurrency, getattr(args, "threads", 1) or 1)
    slots = at_once * (len(cfg.roles) if cfg.strategy != "one_by_one" else 1)

    @contextlib.contextmanager
    def entered():
        with resolve_lm(args.model, slots=slots, temperature=args.temperature, max_tokens=args.max_tokens,
                        served_model=args.served_model, timeout=args.timeout) as lm, \
                dspy.context(lm=lm, adapter=JudgeAdapter()):
            yield lm

    return entered()


def load_items(args):
    """The dataset named by the flags: (items, format)."""
    from chateval_dspy.data.loaders import load_dataset, parse_columns

    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be positive, got {args.limit}")
    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be positive, got {args.concurrency}")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive seconds, got {args.timeout}")
    if not 0 <= args.temperature <= 2:
        raise ConfigError(f"--temperature must lie in 0..2, got {args.temperature}")
    if args.max_tokens is not None and args.max_tokens < 16:
        raise ConfigError(f"--max-tokens must be at least 16, got {args.max_tokens}")
    return load_dataset(args.dataset, fmt=args.format, columns=parse_columns(args.columns))


def run_judged(program, items, cfg, args, out, progress: bool = True, key: str | None = None):
    """Judge ``items`` with a progress bar, resuming from ``out`` if it holds part of this run; returns the RunResult."""
    from tqdm import tqdm

    from chateval_dspy.run.evaluate import evaluate

    with tqdm(total=len(items), unit="item", disable=not progress, file=sys.stderr) as bar:
        result = evaluate(program, items, cfg, out=out, concurrency=args.concurrency, on_item=lambda r: bar.update(1),
                          run_key=key)
    if result.resumed:
        print(f"resumed: {result.resumed} item(s) were already judged in {out}", file=sys.stderr)
    return result


def header_of(args, cfg, model: str, n: int, split: str | None = None) -> dict:
    """What every printed or logged figure states: model, data, split, panel."""
    return {"model": model, "data": args.dataset, "split": f"{split or args.split} (seed {args.seed})", "items": n,
            "strategy": cfg.strategy, "roles": ",".join(cfg.roles), "turns": cfg.turns,
            "calibrate": cfg.calibrate, "aggregate": cfg.aggregate}


def run_evaluate(args):
    """``chateval evaluate`` without printing: (config, items judged, result, header, results path)."""
    from chateval_dspy.data.loaders import select
    from chateval_dspy.program.chateval import build_evaluator

    items, fmt = load_items(args)
    cfg = config_from_args(args, fmt)
    items = select(items, args.split, seed=args.seed, limit=args.limit)
    program = build_evaluator(cfg)
    key = run_key(args, cfg, items)
    out = _out_path(args, key)
    with lm_context(args, cfg) as lm:
        result = run_judged(program, items, cfg, args, out, progress=not args.no_progress, key=key)
        model = lm.model
    return cfg, items, result, header_of(args, cfg, model, result.n), out


def print_summary(result, header, seed: int) -> dict:
    from chateval_dspy.run.table import summary_table

    metrics = result.metrics(seed=seed)
    print(summary_table(metrics, result.cost(), header))
    if result.abstentions:
        print("abstentions by cause: " + ", ".join(f"{k}={v}" for k, v in result.abstentions.most_common()))
    return metrics


def cmd_evaluate(args) -> int:
    _, _, result, header, out = run_evaluate(args)
    print_summary(result, header, args.seed)
    print(f"results: {out}")
    return 0


def _load(args):
    from chateval_dspy.deploy.judge import load

    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be positive, got {args.concurrency}")
    return load(args.evaluator, model=args.model, trust_pickle=args.trust_pickle, slots=args.concurrency,
                timeout=args.timeout, served_model=args.served_model)


def cmd_score(args) -> int:
    from tqdm import tqdm

    from chateval_dspy.data.loaders import parse_columns
    from chateval_dspy.deploy.score_file import score_file

    columns = parse_columns(args.columns)
    with _load(args) as judge, tqdm(unit="item", disable=args.no_progress, file=sys.stderr) as bar:
        report = score_file(judge, args.src, args.out, columns=columns, concurrency=args.concurrency,
                            on_item=lambda r: bar.update(1))
    print(f"rows: {report.total}  scored now: {report.scored}  already done: {report.skipped}  "
          f"rejected: {len(report.rejected)}  -> {args.out}")
    for row, reason in report.rejected:
        print(f"  row {row}: {reason}")
    return 0


def cmd_serve(args) -> int:
    import uvicorn

    from chateval_dspy.deploy.serve import create_app

    token = os.environ.get(args.token_env) or None
    with _load(args) as judge:
        app = create_app(judge, token=token, max_body_bytes=args.max_body_bytes, max_items=args.max_items,
                         queue=args.queue, concurrency=args.concurrency)
        print(f"serving {args.evaluator} on http://{args.host}:{args.port} "
              f"({'bearer token required' if token else 'no token'}); Ctrl-C stops", file=sys.stderr)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


COMMANDS = {"evaluate": cmd_evaluate, "score": cmd_score, "serve": cmd_serve}


def main(argv: list[str] | None = None, *, parser: argparse.ArgumentParser | None = None,
         commands: dict | None = None) -> int:
    """Parse, set up logging, dispatch; every ChatEvalError becomes one line on stderr and exit 2."""
    args = (parser or build_parser()[0]).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # mlflow resets its logger level when imported
        for noisy in ("dspy", "httpx", "openai", "LiteLLM", "mlflow", "alembic"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        return (commands or COMMANDS)[args.command](args)
    except ChatEvalError as exc:
        print(f"chateval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chateval: interrupted; finished items are in the results file", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
