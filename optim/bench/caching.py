"""Cost per verdict under the providers' prompt caches: the layout before and after, panel beside single judge.

A fake provider on 127.0.0.1 bills input tokens by the provider's documented caching rule
(``chateval_dspy.testing.billing``); "before" renders with DSPy's ``JSONAdapter``, "after" with ``DebateAdapter``.
Every row starts from an empty provider cache and judges its items one at a time, in order, as one production run
would. Method and figures: benchmarks/caching.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from unittest import mock

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.data.splits import select
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.pricing import price_for
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.metrics import bootstrap
from chateval_dspy.run.records import read_records
from chateval_dspy.testing.fake_lm import default_responder
from optim.bench import common as bench

# The fake provider that bills a model, by the model string's provider prefix.
PROVIDERS = ("openai", "anthropic")
LAYOUTS = {"before": dspy.JSONAdapter, "after": DebateAdapter}


def panels() -> dict[str, DebateConfig]:
    """The configurations compared: the default panel and the single judge (one referee, one turn, both orders)."""
    panel = DebateConfig()
    return {"panel": panel, "single": replace(panel, roles=panel.roles[:1], turns=1)}


@contextlib.contextmanager
def provider(model: str, responder=default_responder) -> Iterator[object]:
    """A fresh fake provider for ``model`` (an empty cache), reached the way a user reaches the real one (env)."""
    from chateval_dspy.testing.billing import AnthropicCaching, OpenAICaching
    from chateval_dspy.testing.fake_anthropic import FakeAnthropicServer
    from chateval_dspy.testing.fake_server import FakeOpenAIServer

    if model.startswith("openai/"):
        fake, names = FakeOpenAIServer(responder, billing=OpenAICaching(), model=model.split("/", 1)[1]), "OPENAI"
    else:
        fake, names = FakeAnthropicServer(responder, billing=AnthropicCaching()), "ANTHROPIC"
    # patch.dict restores the environment as it was, keys it added removed
    with fake as base, mock.patch.dict(os.environ, {f"{names}_BASE_URL": base, f"{names}_API_BASE": base,
                                                    f"{names}_API_KEY": "fake-key"}):
        yield fake


def item_figures(record: dict, model: str) -> dict:
    """One results line's input tokens, cache reads and writes, and dollars with and without the cache."""
    price = price_for(model)
    prompt, completion = record["prompt_tokens"], record["completion_tokens"]
    return {"prompt": prompt, "completion": completion, "read": record.get("cached_prompt_tokens") or 0,
            "written": record.get("cache_write_tokens") or 0, "usd": record["cost_usd"],
            "usd_list": price.usd(prompt, completion) if price else None, "calls": record["calls"],
            "abstained": record["abstained"] is not None}


def summarise(per_item: list[dict], *, seed: int = 0) -> dict:
    """Per 1,000 verdicts, with 95% bootstrap CIs over items: USD with the cache and at list price, cached share."""
    def mean_k(col):
        return bootstrap(lambda c: 1000 * sum(c) / len(c), col, seed=seed).to_dict()

    prompt = [f["prompt"] for f in per_item]
    read = [f["read"] for f in per_item]
    n = len(per_item)
    return {"items": n, "calls_per_item": sum(f["calls"] for f in per_item) / n,
            "prompt_tokens_per_item": sum(prompt) / n, "completion_tokens_per_item": sum(f["completion"] for f in per_item) / n,
            "cached_prompt_tokens_per_item": sum(read) / n,
            "cache_write_tokens_per_item": sum(f["written"] for f in per_item) / n,
            "cached_prompt_share": bootstrap(lambda r, p: sum(r) / sum(p), read, prompt, seed=seed).to_dict(),
            "usd_per_1000": mean_k([f["usd"] for f in per_item]) if all(f["usd"] is not None for f in per_item) else None,
            "usd_list_per_1000": mean_k([f["usd_list"] for f in per_item]) if per_item[0]["usd_list"] is not None else None,
            "abstained": sum(f["abstained"] for f in per_item)}


def measure(model: str, name: str, cfg: DebateConfig, layout: str, items, *, program=None, workdir: Path) -> dict:
    """One row: ``items`` judged by ``program`` (default: built from ``cfg``) on a fresh fake provider."""
    from chateval_dspy.lm.resolve import resolve_lm

    program = program or build_evaluator(cfg)
    out = workdir / f"{bench.slug(model)}-{name}-{layout}.jsonl"
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    with provider(model) as fake, resolve_lm(model, timeout=30, retries=0) as lm, \
            dspy.context(lm=lm, adapter=LAYOUTS[layout]()):
        evaluate(program, items, cfg, out=out, run_key=f"{model}-{name}-{layout}")
        requests = len(fake.requests)
    per_item = [item_figures(r, model) for r in read_records(out)]
    return {"model": model, "config": name, "layout": layout, "requests": requests,
            "wall_seconds": time.perf_counter() - start, **summarise(per_item)}


def compiled_panel(items_train, *, demos: int = 4):
    """The default panel compiled with ``bootstrap`` on the scripted fake (``demos`` per predictor, argue and judge)."""
    from chateval_dspy.testing.fake_lm import fake_lm
    from optim.tuning.compile import OptimizerSettings, compile_evaluator
    from optim.tuning.objectives import agreement

    cfg = DebateConfig()
    with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):
        program = compile_evaluator(build_evaluator(cfg), optimizer="bootstrap", trainset=items_train, valset=None,
                                    metric=agreement, settings=OptimizerSettings(max_demos=demos))
    counts = {n: len(p.demos) for n, p in program.named_predictors()}
    return program, cfg, counts


def check_models(models: list[str]) -> None:
    """Each model is billed by a fake of its provider and priced by the cost map, or the run stops before it starts."""
    from chateval_dspy.errors import ConfigError

    for model in models:
        if model.split("/", 1)[0] not in PROVIDERS:
            raise ConfigError(f"--models: {model!r} is not an {' or '.join(PROVIDERS)} model string")
        if price_for(model) is None:
            raise ConfigError(f"--models: LiteLLM's cost map does not price {model!r}")


def provider_rows(args, workdir: Path) -> list[dict]:
    """Every model x configuration x layout, on the same items."""
    check_models(args.models)
    all_items, _ = load_dataset("faireval")
    items = select(all_items, args.split, seed=args.seed, limit=args.limit)
    train = select(all_items, "train", seed=args.seed)
    program, cfg, counts = compiled_panel(train, demos=args.demos)
    rows = []
    for model in args.models:
        for layout in LAYOUTS:
            rows += [measure(model, name, config, layout, items, workdir=workdir) for name, config in panels().items()]
            row = measure(model, "compiled", cfg, layout, items, program=program, workdir=workdir)
            rows.append({**row, "demos": counts})
    return rows


def embedded_rows(args, workdir: Path) -> list[dict]:
    """The embedded model, before and after: prompt tokens llama.cpp computed per item, and the parse rate."""
    all_items, _ = load_dataset("faireval")
    items = select(all_items, args.split, seed=args.seed, limit=args.embedded_limit)
    cfg = DebateConfig()
    factory = bench.model_factory("embedded", threads=args.threads)
    rows = []
    for layout, adapter in LAYOUTS.items():
        with factory(2) as lm, dspy.context(lm=lm, adapter=adapter()):
            meter = bench.attach_meter(lm)
            run = bench.run_config(build_evaluator(cfg), items, cfg, out=workdir / f"embedded-{layout}.jsonl",
                                   key=f"embedded-{layout}", meter=meter)
        r, n = run.result, max(run.result.n, 1)
        cached = (run.meter or {}).get("cached_tokens") or 0
        rows.append({"layout": layout, "items": r.n, "calls_per_item": r.calls / n,
                     "prompt_tokens_per_item": r.prompt_tokens / n,
                     "prompt_tokens_computed_per_item": (r.prompt_tokens - cached) / n,
                     "completion_tokens_per_item": r.completion_tokens / n,
                     "computed_tokens_per_item": (r.prompt_tokens + r.completion_tokens - cached) / n,
                     "referee_turns_abstained": dict(r.referee_abstentions), "items_abstained": sum(r.abstentions.values()),
                     "seconds_per_item": r.wall_seconds / n})
    return rows


def run_caching(args) -> dict:
    bench.isolate_cache()  # an answer from DSPy's LM cache would bill nothing
    workdir = Path(tempfile.mkdtemp(prefix="chateval-bench-caching-"))
    report: dict = {"rows": provider_rows(args, workdir)}
    if args.skip_embedded:  # the embedded rows of the last full run, if any
        kept = json.loads(Path(args.out).read_text(encoding="utf-8")) if Path(args.out).exists() else {}
        report["embedded"] = kept.get("embedded", [])
    else:
        report["embedded"] = embedded_rows(args, workdir)
    report["header"] = bench.header(args, suite="caching", model=", ".join(args.models), data="faireval",
                                    split=f"{args.split} (seed {args.seed})", n=args.limit,
                                    embedded_n=args.embedded_limit, train_for_demos="faireval train split")
    return bench.write_report(args.out, report)


def est_text(d: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    from optim.bench.stats import fmt_est

    return fmt_est(d, scale, digits) if d else "unpriced"


def _row(model: str, rows: list[dict], config: str, layout: str) -> dict | None:
    return next((r for r in rows if r["model"] == model and r["config"] == config and r["layout"] == layout), None)


def targets(report: dict) -> list[dict]:
    """The issue's targets, per model: the panel's dollars against before and against the single judge; cached shares."""
    out, rows = [], report["rows"]
    for model in dict.fromkeys(r["model"] for r in rows):
        before, after = _row(model, rows, "panel", "before"), _row(model, rows, "panel", "after")
        single, compiled = _row(model, rows, "single", "after"), _row(model, rows, "compiled", "after")
        if not (before and after and single and after["usd_per_1000"] and before["usd_per_1000"]):
            continue
        a, b, s = (after["usd_per_1000"]["value"], before["usd_per_1000"]["value"], single["usd_per_1000"]["value"])
        out += [{"model": model, "target": "panel USD per 1,000 verdicts <= 0.45x before", "measured": f"{a / b:.2f}x "
                 f"(${a:.2f} vs ${b:.2f})", "met": a <= 0.45 * b},
                {"model": model, "target": "panel <= 1.5x the single judge", "measured": f"{a / s:.2f}x (${a:.2f} vs "
                 f"${s:.2f})", "met": a <= 1.5 * s},
                {"model": model, "target": "panel cached share of input tokens >= 50%",
                 "measured": est_text(after["cached_prompt_share"], 100, 1) + "%",
                 "met": after["cached_prompt_share"]["value"] >= 0.5}]
        if compiled:
            out.append({"model": model, "target": "compiled panel (4 demos per predictor) cached share >= 70%",
                        "measured": est_text(compiled["cached_prompt_share"], 100, 1) + "%",
                        "met": compiled["cached_prompt_share"]["value"] >= 0.7})
    return out


def caching_markdown(report: dict, markdown: bool = True) -> str:
    from optim.bench.markdown import stated, table, targets_lines
    from optim.bench.stats import fmt_num

    h = report["header"]
    body = [[r["model"], r["config"], r["layout"], fmt_num(r["calls_per_item"]), fmt_num(r["prompt_tokens_per_item"], 0),
             fmt_num(r["cached_prompt_tokens_per_item"], 0), fmt_num(r["cache_write_tokens_per_item"], 0),
             est_text(r["cached_prompt_share"], 100, 1), est_text(r["usd_list_per_1000"]), est_text(r["usd_per_1000"]),
             fmt_num(r["wall_seconds"] / max(r["items"], 1), 3), r["abstained"]] for r in report["rows"]]
    out = [stated(h, markdown), "", table(["model", "configuration", "layout", "calls/item", "input tokens/item",
                                           "cached prompt tokens/item", "cache write tokens/item",
                                           "cached share % [95% CI]", "USD/1,000 verdicts, list [95% CI]",
                                           "USD/1,000 verdicts, with the cache [95% CI]", "s/item",
                                           "items abstained"],
                                          body, markdown)]
    emb = report.get("embedded") or []
    if emb:
        out += ["", f"Embedded model (llama.cpp prefix cache; {emb[0]['items']} items):", ""]
        rows = [[e["layout"], fmt_num(e["calls_per_item"]), fmt_num(e["prompt_tokens_per_item"], 0),
                 fmt_num(e["prompt_tokens_computed_per_item"], 0), fmt_num(e["completion_tokens_per_item"], 0),
                 fmt_num(e["computed_tokens_per_item"], 0), e["items_abstained"],
                 ", ".join(f"{k} {v}" for k, v in e["referee_turns_abstained"].items()) or "none",
                 fmt_num(e["seconds_per_item"], 1)] for e in emb]
        out.append(table(["layout", "calls/item", "prompt tokens/item", "prompt tokens computed/item",
                          "generated tokens/item", "tokens computed/item", "items abstained", "turns abstained",
                          "s/item"], rows, markdown))
    return "\n".join(out + targets_lines(targets(report), markdown))
