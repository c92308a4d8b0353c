"""How a benchmark runs one configuration: resumable ``evaluate`` plus a meter around the LM engine.

The meter wraps the engine's ``complete`` (shared by every ``lm.copy``), so the suites can
tell time spent inside the model from time spent in the framework, and it reads how many
prompt tokens an OpenAI-compatible server reused from its prefix cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.identity import digest
from chateval_dspy.run.records import read_records
from chateval_dspy.run.result import RunResult

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


def _meter_prefix_cache(engine, meter: Meter) -> None:
    """Count the prompt tokens the server reused from its prefix cache, from the raw responses of ``engine.client``."""
    completions = getattr(getattr(getattr(engine, "client", None), "chat", None), "completions", None)
    if completions is None:
        return
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
    _meter_prefix_cache(engine, meter)
    return meter


# --- runs --------------------------------------------------------------------------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-").lower() or "x"


def bench_key(**parts) -> str:
    """What identifies a benchmark run, without the item limit: a larger ``--limit`` resumes the same file."""
    return digest(parts)


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


# --- the LM, and what every table states -------------------------------------------------------------------------

BENCH_DIR = Path("benchmarks")
RAW_DIR = BENCH_DIR / "raw"

# ``slots -> context manager yielding a dspy.LM``: production resolves --model; tests pass the fake LM here.
LMFactory = Callable[[int], contextlib.AbstractContextManager]


def model_factory(spec: str, *, timeout: float = 120.0, served_model: str | None = None,
                  threads: int | None = None) -> LMFactory:
    """The LM named by ``--model`` (``embedded``, a base URL, a LiteLLM string), at temperature 0. ``threads`` caps
    the embedded server's CPU threads: two llama.cpp servers that each spin on every core slow each other many times."""
    from chateval_dspy.lm.resolve import resolve_lm

    def factory(slots: int):
        return resolve_lm(spec, slots=slots, temperature=0.0, served_model=served_model, timeout=timeout,
                          threads=threads or None)

    return factory


def isolate_cache() -> str:
    """DSPy's LM cache off, and a fresh ``CHATEVAL_CACHE_DIR``: a cache hit would cost 0 tokens and 0 seconds."""
    from chateval_dspy.lm.resolve import configure_cache

    path = tempfile.mkdtemp(prefix="chateval-bench-cache-")
    os.environ["CHATEVAL_CACHE_DIR"] = path
    configure_cache(enabled=False)
    return path


@contextlib.contextmanager
def judging(factory: LMFactory, slots: int = 1) -> Iterator[dspy.LM]:
    """Enter the LM with the JSON adapter, as the CLI does."""
    with factory(slots) as lm, dspy.context(lm=lm, adapter=DebateAdapter()):
        yield lm


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
            "lm_threads": getattr(args, "threads", None) or "all cores",
            "command": getattr(args, "command_line", f"python -m optim.bench.main {suite}"), **extra}


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


def write_report(path: str | Path, report: dict) -> dict:
    """Write a suite's figures JSON; the report with its ``path``."""
    return {**report, "path": str(write_json(path, report))}


# --- the flags several suites share --------------------------------------------------------------------------------

PROVIDER_MODELS = ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5", "anthropic/claude-sonnet-4-5"]


def markdown_flag(p) -> None:
    p.add_argument("--markdown", action="store_true", help="print Markdown tables (default: plain text)")


def split_flags(p) -> None:
    p.add_argument("--split", default="test", choices=["all", "train", "dev", "test"])
    p.add_argument("--seed", type=int, default=0)


def provider_flags(p, models_help: str) -> None:
    """The provider models and FairEval items of the suites on billing fakes (caching, batch)."""
    p.add_argument("--models", type=lambda v: v.split(","), default=PROVIDER_MODELS, help=models_help)
    split_flags(p)
    p.add_argument("--limit", type=int, default=20, help="FairEval items per row (default 20)")
