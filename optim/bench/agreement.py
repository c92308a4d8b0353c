"""The agreement suite: every configuration of the paper (``catalogue``) on one model and one split, against the
single agent, plus a compiled program (``--program``) and the baselines that need no LM."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.data.splits import select
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.task import builtin_task
from chateval_dspy.run.metrics import pairwise_report, plain, pointwise_report
from optim.bench import common as bench
from optim.bench.catalogue import REFERENCE, Entry, choose, program_for
from optim.bench.stats import mcnemar, paired_correlation_delta


def _row(entry: Entry, fmt: str, items, predictions: dict, cost: dict | None = None, seed: int = 0,
         n_resamples: int | None = None) -> dict:
    ids = [str(x.id) for x in items]
    figures, human = ((pairwise_report, [x.label for x in items]) if fmt == "pairwise"
                      else (pointwise_report, [x.human for x in items]))
    metrics = figures(human, [predictions.get(i) for i in ids], seed=seed, n_resamples=n_resamples)
    return {"name": entry.name, "label": entry.label, "kind": entry.kind,
            "config": entry.config.to_dict() if entry.config else None,
            "n": len(ids), "metrics": plain(metrics),
            "predictions": predictions, "cost": cost}


def _cost(run) -> dict:
    # Meter totals (engine time, reused prompt tokens) are per item over every item in the results file,
    # which may hold more items than this run's --limit; the other figures are over this run's items.
    cost = run.result.cost()
    cost["tokens_per_item"] = cost["prompt_tokens_per_item"] + cost["completion_tokens_per_item"]
    meter = run.meter or {}
    n_metered = meter.get("items") or 0
    if meter.get("cached_tokens") is not None and n_metered:
        cost["cached_prompt_tokens_per_item"] = meter["cached_tokens"] / n_metered
        cost["computed_tokens_per_item"] = cost["tokens_per_item"] - cost["cached_prompt_tokens_per_item"]
    if meter.get("engine_seconds") is not None and n_metered:
        cost["engine_seconds_per_item"] = meter["engine_seconds"] / n_metered
    cost["judged_now"] = run.fresh
    return cost


def _significance(rows: list[dict], fmt: str, items, seed: int, n_resamples: int | None = None) -> None:
    ref = next(r for r in rows if r["name"] == REFERENCE)
    if fmt == "pairwise":
        labels = {str(x.id): x.label for x in items}
        correct = {r["name"]: {i: r["predictions"].get(i) == labels[i] for i in labels} for r in rows}
        for r in rows:
            r["vs_single"] = None if r is ref else mcnemar(correct[REFERENCE], correct[r["name"]])
        return
    human = {str(x.id): x.human for x in items}
    for r in rows:
        r["vs_single"] = None if r is ref else paired_correlation_delta(human, ref["predictions"], r["predictions"],
                                                                        seed=seed, n_resamples=n_resamples)


def run_agreement(args, factory: bench.LMFactory) -> dict:
    """Judge the split with every chosen configuration; write the figures JSON; return it with its tables."""
    all_items, fmt = load_dataset(args.dataset)
    items = select(all_items, args.split, seed=args.seed, limit=args.limit)
    entries = choose(args.configs, fmt, mec_k=args.mec_k, bertscore=args.bertscore)
    if args.program:
        from chateval_dspy.deploy.saved.store import read_card

        card = read_card(args.program)
        entries.append(Entry("compiled", f"compiled program ({Path(args.program).name}, "
                                         f"{card.get('optimizer', '?')})", "compiled", DebateConfig.from_dict(card["config"])))
    rows: list[dict] = []
    lm_entries = [e for e in entries if e.kind in ("debate", "mec", "compiled")]
    model = args.model
    if lm_entries:
        with bench.judging(factory, slots=args.concurrency) as lm:
            model = lm.model
            meter = bench.attach_meter(lm)
            base = Path(args.work_dir) / f"agreement-{args.dataset}-{args.split}-s{args.seed}-{bench.slug(model)}"
            for entry in lm_entries:
                program, cfg = program_for(entry, args)
                if cfg.format != fmt:
                    raise ConfigError(f"{entry.name}: a {cfg.format} program cannot judge {args.dataset} ({fmt})")
                key = bench.bench_key(suite="agreement", entry=entry.name, kind=entry.kind, config=cfg.changes(),
                                      model=model, dataset=args.dataset, split=args.split, seed=args.seed,
                                      mec_k=args.mec_k if entry.kind == "mec" else None,
                                      program=str(args.program) if entry.kind == "compiled" else None)
                run = bench.run_config(program, items, cfg, out=base / f"{entry.name}.jsonl", key=key,
                                       concurrency=args.concurrency, meter=meter)
                preds = {str(r["id"]): r["prediction"] for r in run.records}
                rows.append(_row(entry, fmt, items, preds, _cost(run), args.seed, args.resamples))
    for entry in entries:
        if entry.kind == "majority":
            train = select(all_items, "train", seed=args.seed) if args.split != "train" else items
            top = Counter(x.label for x in train).most_common(1)[0][0]
            rows.append(_row(entry, fmt, items, {str(x.id): top for x in items}, None, args.seed, args.resamples))
        elif entry.kind == "text":
            from optim.bench.text import text_scores

            scores, note = text_scores(entry.name, items, all_items)
            if scores is None:
                print(f"bench: skipping {entry.name}: {note}", file=sys.stderr)
                continue
            preds = {i: dict.fromkeys(builtin_task("pointwise").ordinal_ranges, s) for i, s in scores.items()}
            row = _row(entry, fmt, items, preds, None, args.seed, args.resamples)
            row["note"] = note
            rows.append(row)
    order = [e.name for e in entries]
    rows.sort(key=lambda r: order.index(r["name"]))
    _significance(rows, fmt, items, args.seed, args.resamples)
    report = {"header": bench.header(args, suite="agreement", model=model, data=args.dataset,
                                     split=f"{args.split} (seed {args.seed})", n=len(items), limit=args.limit, format=fmt),
              "rows": rows}
    return bench.write_report(args.out or bench.BENCH_DIR / f"agreement-{args.dataset}.json", report)

