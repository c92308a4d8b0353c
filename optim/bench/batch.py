"""Batch mode's price and shape: USD per 1,000 verdicts live and batched, waves against the critical path, and
requests submitted against requests needed (also after a stop between waves).

A fake provider bills by the provider's caching rule and implements its Batch API; the stop is in-process (the wave
driver's provider raises after a chosen wave). Method and figures: benchmarks/batch.md.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.data.splits import select
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.critical_path import critical_path
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.evaluate_dataset import journal_folder
from chateval_dspy.run.records import read_records
from optim.bench import common as bench
from optim.bench.caching import compiled_panel, item_figures, provider, summarise

STRATEGIES = ("one_by_one", "simultaneous_talk", "simultaneous_talk_with_summarizer")


def submitted(fake) -> int:
    """Requests a fake provider received in batches (each time a request was in a submitted batch)."""
    counter = fake.batches.submitted if hasattr(fake, "batches") else fake.submitted
    return sum(counter.values())


def judge(model: str, cfg: DebateConfig, items, out: Path, *, batch: bool, program=None, stop_after: int | None = None):
    """``items`` judged live or batched into ``out`` on the current fake provider; the run's ``Waves`` (batched)."""
    spec = LMSpec(model=model, cache=False, batch=batch, batch_poll=0.01, timeout=30, retries=2)
    program = program or build_evaluator(cfg)
    with spec.judging(len(items) * 2, journal=journal_folder(out)) as lm:
        waves = getattr(lm.engine, "waves", None) if batch else None
        if waves is not None:
            waves.expected = critical_path(cfg)["chain"]
            if stop_after is not None:
                waves.provider = _Stopping(waves.provider, waves, stop_after)
        with contextlib.suppress(Exception) if stop_after is not None else contextlib.nullcontext():
            evaluate(program, items, cfg, out=out, concurrency=len(items) if batch else 4, run_key="bench",
                     waves=batch)
    return waves


class _Stopping:
    """A provider that stops the run before submitting the wave after ``after``: a stop between waves."""

    def __init__(self, inner, waves, after: int):
        self.inner, self.waves, self.after, self.name = inner, waves, after, inner.name

    def submit(self, requests, label):
        if self.waves.wave > self.after:
            raise RuntimeError(f"stopped before wave {self.waves.wave}")
        return self.inner.submit(requests, label)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def measure(model: str, name: str, cfg: DebateConfig, items, workdir: Path, *, batch: bool, program=None) -> dict:
    """One row: the items judged on a fresh fake provider, live or batched."""
    out = workdir / f"{bench.slug(model)}-{name}-{'batch' if batch else 'live'}.jsonl"
    out.unlink(missing_ok=True)
    with provider(model) as fake:
        waves = judge(model, cfg, items, out, batch=batch, program=program)
        sent = submitted(fake) if batch else len(fake.requests)
    price_model = ("batch/" if batch else "") + model
    per_item = [item_figures(r, model) for r in read_records(out)]
    row = {"model": model, "config": name, "mode": "batch" if batch else "live", "requests": sent,
           "calls_needed": sum(f["calls"] for f in per_item), **summarise(per_item), "priced_as": price_model}
    if waves is not None:
        row.update(waves=waves.wave, expected_waves=waves.expected, batches=len(set(waves.batch_ids)))
    return row


def stop_and_resume(model: str, cfg: DebateConfig, items, workdir: Path, *, stop_after: int = 2) -> dict:
    """A batched run stopped after wave ``stop_after`` and run again: requests submitted over both runs."""
    out = workdir / f"{bench.slug(model)}-stopped.jsonl"
    out.unlink(missing_ok=True)
    with provider(model) as fake:
        judge(model, cfg, items, out, batch=True, stop_after=stop_after)
        before = submitted(fake)
        judge(model, cfg, items, out, batch=True)
        total = submitted(fake)
    needed = sum(r["calls"] for r in read_records(out))
    return {"model": model, "stopped_after_wave": stop_after, "submitted_before_stop": before,
            "submitted_in_all": total, "calls_needed": needed, "items": len(read_records(out))}


def strategy_rows(model: str, items, workdir: Path) -> list[dict]:
    """Waves per strategy (three referees, two turns) against the critical path each states."""
    rows = []
    for strategy in STRATEGIES:
        cfg = DebateConfig(strategy=strategy, roles=("general_public", "critic", "scientist"), turns=2)
        row = measure(model, strategy, cfg, items, workdir, batch=True)
        path = critical_path(cfg)
        rows.append({"strategy": strategy, "waves": row["waves"], "critical_path": path["chain"],
                     "calls_per_item": path["calls"], "requests": row["requests"], "calls_needed": row["calls_needed"]})
    return rows


def run_batch(args) -> dict:
    bench.isolate_cache()  # an answer from DSPy's LM cache would bill nothing
    workdir = Path(tempfile.mkdtemp(prefix="chateval-bench-batch-"))
    all_items, _ = load_dataset("faireval")
    items = select(all_items, args.split, seed=args.seed, limit=args.limit)
    program, cfg, counts = compiled_panel(select(all_items, "train", seed=args.seed), demos=args.demos)
    rows = []
    for model in args.models:
        for batch in (False, True):
            rows.append(measure(model, "panel", DebateConfig(), items, workdir, batch=batch))
            rows.append({**measure(model, "compiled", cfg, items, workdir, batch=batch, program=program),
                         "demos": counts})
    report = {"rows": rows, "strategies": strategy_rows(args.models[0], items[: args.strategy_limit], workdir),
              "stop": stop_and_resume(args.models[0], DebateConfig(), items, workdir)}
    report["header"] = bench.header(args, suite="batch", model=", ".join(args.models), data="faireval",
                                    split=f"{args.split} (seed {args.seed})", n=args.limit,
                                    strategies_n=args.strategy_limit, train_for_demos="faireval train split")
    return bench.write_report(args.out, report)


def _row(rows: list[dict], model: str, config: str, mode: str) -> dict | None:
    return next((r for r in rows if (r["model"], r["config"], r["mode"]) == (model, config, mode)), None)


def targets(report: dict) -> list[dict]:
    """The issue's targets: batched USD per 1,000 verdicts <= 0.25x the same panel's live run before the cost work
    (list prices: no batch discount, no prompt cache), where the provider applies both discounts; waves = critical
    path; requests submitted = requests needed, also across a stop."""
    out, rows = [], report["rows"]
    for model in dict.fromkeys(r["model"] for r in rows):
        for config in ("panel", "compiled"):
            live, batched = _row(rows, model, config, "live"), _row(rows, model, config, "batch")
            if live and batched and live["usd_list_per_1000"] and batched["usd_per_1000"]:
                a, b = batched["usd_per_1000"]["value"], live["usd_list_per_1000"]["value"]
                c = live["usd_per_1000"]["value"]
                out.append({"model": model, "target": f"{config}: batched USD/1,000 verdicts <= 0.25x live at list price",
                            "measured": f"{a / b:.2f}x (${a:.3f} vs ${b:.3f}; {a / c:.2f}x live with the prompt cache)",
                            "met": a <= 0.25 * b})
            if batched:
                out.append({"model": model, "target": f"{config}: waves = critical path, requests = needed",
                            "measured": f"{batched['waves']} waves of {batched['expected_waves']}; "
                                        f"{batched['requests']} of {batched['calls_needed']} requests",
                            "met": batched["waves"] == batched["expected_waves"]
                            and batched["requests"] == batched["calls_needed"]})
    stop = report["stop"]
    out.append({"model": stop["model"], "target": "requests submitted = needed after a stop between waves",
                "measured": f"{stop['submitted_in_all']} of {stop['calls_needed']} (stopped after wave "
                            f"{stop['stopped_after_wave']})", "met": stop["submitted_in_all"] == stop["calls_needed"]})
    return out


def batch_markdown(report: dict, markdown: bool = True) -> str:
    from optim.bench.caching import est_text
    from optim.bench.markdown import stated, table, targets_lines
    from optim.bench.stats import fmt_num

    body = [[r["model"], r["config"], r["mode"], fmt_num(r["calls_per_item"]), fmt_num(r["prompt_tokens_per_item"], 0),
             est_text(r["cached_prompt_share"], 100, 1), est_text(r["usd_list_per_1000"], 1, 3) if r["mode"] == "live" else "-",
             est_text(r["usd_per_1000"], 1, 3), r.get("waves", "-"),
             r.get("expected_waves", "-"), f"{r['requests']} / {r['calls_needed']}"] for r in report["rows"]]
    out = [stated(report["header"], markdown), "",
           table(["model", "configuration", "mode", "calls/item", "input tokens/item", "cached share % [95% CI]",
                  "USD/1,000 verdicts at list price [95% CI]", "USD/1,000 verdicts [95% CI]", "waves", "critical path",
                  "requests sent / needed"], body, markdown),
           "", "Waves per strategy (three referees, two turns):", "",
           table(["strategy", "waves", "critical path", "calls/item", "requests sent / needed"],
                 [[s["strategy"], s["waves"], s["critical_path"], s["calls_per_item"],
                   f"{s['requests']} / {s['calls_needed']}"] for s in report["strategies"]], markdown),
           *targets_lines(targets(report), markdown)]
    return "\n".join(out)


def add_parser(sub) -> None:
    ba = sub.add_parser("batch", help="USD per 1,000 verdicts live and batched, waves and requests (fake batch APIs)")
    bench.provider_flags(ba, "comma-separated provider models, priced by LiteLLM's cost map (batch rates when batched)")
    ba.add_argument("--strategy-limit", type=int, default=5, help="items per strategy row (default 5)")
    ba.add_argument("--demos", type=int, default=4, help="demonstrations per predictor of the compiled panel")
    ba.add_argument("--out", default=str(bench.BENCH_DIR / "batch.json"))
    bench.markdown_flag(ba)
