"""A two-stage cascade (single judge, then the default panel) through the real LM path, billed by the providers' rules.

The fake provider bills as in ``optim.bench.caching`` and answers as the simulated referees (difficulty spread 1.0),
so confidence carries information: agreement figures are the simulator's, not a model's. ``--fixed-threshold`` is
illustrative, not guaranteed. Method and figures: benchmarks/selective.md.

    python -m optim.bench cascade-billing --limit 20 --embedded-limit 2
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

from chateval_dspy.data.spec import DataSpec
from optim.bench import caching
from optim.bench import common as bench

MODELS = ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"]


def add_parser(sub) -> None:
    cb = sub.add_parser("cascade-billing", help="a single judge then the default panel, FairEval through the real LM "
                                                "path on fake providers billing by their caching rules")
    cb.add_argument("--models", type=lambda v: v.split(","), default=MODELS, help="comma-separated provider models")
    cb.add_argument("--limit", type=int, default=20, help="FairEval test items, both halves together (default 20)")
    cb.add_argument("--seed", type=int, default=0, help="the split's seed")
    cb.add_argument("--level", type=float, default=0.8, help="agreement asked for (default 0.8)")
    cb.add_argument("--risk", type=float, default=0.1, help="accepted risk (default 0.1)")
    cb.add_argument("--fixed-threshold", type=float, default=0.75,
                    help="the single judge's illustrative threshold (calibrated confidence; default 0.75)")
    cb.add_argument("--embedded-limit", type=int, default=2, help="items the embedded model judges (0: none)")
    cb.add_argument("--threads", type=int, help="embedded model: CPU threads")
    cb.add_argument("--work-dir", help="saved evaluators and results files (default: a temporary folder)")
    cb.add_argument("--out", help="also write the figures as JSON here")


def save_stages(root: Path, model: str) -> list[tuple[str, Path]]:
    """Both stages (the single judge, the default panel) as saved evaluators whose card names ``model``."""
    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.deploy.saved.store import save_program
    from chateval_dspy.program.chateval import build_evaluator

    out = []
    for name, cfg in reversed(caching.panels().items()):
        program = build_evaluator(cfg)
        out.append((name, save_program(program, root / name, make_card(program, model=model))))
    return out


def sim_responder():
    """The simulated referees over every FairEval item (difficulty spread 1.0; the cheap referee weaker)."""
    from chateval_dspy.data.loaders import load_dataset
    from chateval_dspy.testing.sim_lm import SimKnobs, SimReferees, builtin_personas, label_table

    items, _ = load_dataset("faireval")
    knobs = SimKnobs(difficulty_spread=1.0, accuracy=(("general_public", 0.75),), default_accuracy=0.85)
    return SimReferees(knobs, label_table(items), builtin_personas())


def fixed(level: float, risk: float, thresholds: list[float | None]):
    """A ``Cascade`` at stated thresholds (not chosen by the test: nothing is guaranteed)."""
    from optim.tuning.selective import Cascade, Selection, exact_rate

    empty = exact_rate(0, 0)
    return Cascade(tuple(Selection(level, risk, t, 0, empty, empty) for t in thresholds), level, risk, empty, empty)


def model_rows(model: str, args, root: Path) -> dict:
    """One model: both stages judged on both halves, then the chosen and the illustrative cascade on the check half."""
    from chateval_dspy.lm.spec import LMSpec
    from optim.tuning.calibrate import calibration_items
    from optim.tuning.cascade import DeclaredCascade, DeclaredStage, check_figures, judge_stage, routed, split_of
    from optim.tuning.selective import choose_cascade_thresholds

    root = root / bench.slug(model)
    declared = DeclaredCascade(args.level, args.risk, tuple(DeclaredStage(n, d) for n, d in
                                                            save_stages(root / "programs", model)))
    data, task = split_of(declared, DataSpec("faireval", limit=args.limit, seed=args.seed), args.seed)
    parts = calibration_items(data)
    start = time.perf_counter()
    with caching.provider(model, sim_responder()) as fake:
        runs = [judge_stage(s, i, parts, data, root / "out", method="isotonic", lm=LMSpec())
                for i, s in enumerate(declared.stages, start=1)]
        requests = len(fake.requests)
    calibration, check = routed(runs, parts["calibration"], task), routed(runs, parts["check"], task)
    chosen = choose_cascade_thresholds(calibration.pairs(), level=args.level, risk=args.risk)
    illustrative = fixed(args.level, args.risk, [args.fixed_threshold, 0.0])
    return {"model": model, "items": {h: len(v) for h, v in parts.items()}, "requests": requests,
            "wall_seconds": time.perf_counter() - start, "runs": runs,
            "chosen": {"selection": [s.to_dict() for s in chosen.stages],
                       **check_figures(runs, chosen, check, seed=args.seed)},
            "illustrative": {"thresholds": [args.fixed_threshold, 0.0],
                             **check_figures(runs, illustrative, check, seed=args.seed)}}


def saved_cascade(result: dict, args, root: Path) -> Path:
    """The first model's stages with their fitted maps, saved as a cascade at the illustrative thresholds."""
    from chateval_dspy.deploy.saved.cascade import save_cascade
    from optim.tuning.cascade import save_fitted

    fitted = [save_fitted(run, i, root / "fitted") for i, run in enumerate(result["runs"], start=1)]
    return save_cascade(root / "cascade", [(run.stage.name, d) for run, d in zip(result["runs"], fitted)],
                        [args.fixed_threshold, 0.0], level=args.level, risk=args.risk,
                        report={"note": "illustrative thresholds, not chosen by the test"}).parent


def parsed(verdict) -> bool:
    """Every referee of the verdict's stages gave a verdict in each answer order, and the item got one (or went to a
    person with the last stage's verdict withheld)."""
    votes = [v for per_order in verdict.referees.values() for v in per_order]
    return bool(votes) and all(v is not None for v in votes) and verdict.abstained in (None, "needs_person")


def embedded_rows(cascade_dir: Path, items: list, args) -> dict:
    """The saved cascade on the embedded model (every stage), through ``load()``: per item, stages run, the stage
    that gave the verdict, whether it parsed, calls and seconds."""
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.lm.spec import LMSpec

    rows = []
    with load(cascade_dir, lm=LMSpec(model="embedded"), slots=1) as judge:
        for x in items:
            v = judge({k: x[k] for k in ("id", "question", "answer_1", "answer_2")})
            rows.append({"id": v.id, "stages_run": v.stages_run, "stage": v.stage, "winner": v.winner,
                         "abstained": v.abstained, "parsed": parsed(v), "calls": v.calls, "seconds": v.seconds,
                         "confidence": v.confidence})
    return {"items": len(rows), "parsed": sum(r["parsed"] for r in rows), "rows": rows}


def run_cascade_billing(args) -> int:
    """Every model's tables, and the embedded model's run; printed, and written to ``--out``."""
    if not 0 <= args.fixed_threshold <= 1 or args.limit < 4:
        print("bench: error: --fixed-threshold must lie in [0, 1] and --limit be at least 4")
        return 2
    bench.isolate_cache()  # an answer from DSPy's LM cache would bill nothing
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="chateval-bench-cascade-"))
    results = [model_rows(model, args, root) for model in args.models]
    embedded = None
    if args.embedded_limit:
        from optim.tuning.calibrate import calibration_items

        data = DataSpec("faireval", limit=args.limit, seed=args.seed, split="test")
        items = calibration_items(data)["check"][: args.embedded_limit]
        embedded = embedded_rows(saved_cascade(results[0], args, root), items, args)
    report = {"header": {"data": "faireval", "split": f"test (seed {args.seed}), first {args.limit} items",
                         "level": args.level, "risk": args.risk, "fixed_threshold": args.fixed_threshold},
              "models": [figures(r) for r in results], "embedded": embedded}
    print(render(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


def figures(result: dict) -> dict:
    """A model's result as plain data (the stage runs dropped)."""
    return _data({k: v for k, v in result.items() if k != "runs"})


def _data(value):
    """``value`` as JSON data: estimates by ``to_dict``, dataclasses by their fields, NaN as None."""
    import dataclasses

    if hasattr(value, "to_dict"):
        return _data(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _data(vars(value))
    if isinstance(value, dict):
        return {k: _data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_data(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _rate(e: dict) -> str:
    if not e or not e.get("n"):
        return "n/a (no verdict)"
    return f"{e['value']:.1%} [{e['ci_low']:.1%}, {e['ci_high']:.1%}] of {e['n']}"


def _usd(e: dict | None) -> str:
    if e is None:
        return "unpriced"
    if e.get("value") is None:
        return "n/a (no verdict given)"
    ci = "" if e.get("ci_low") is None else f" [${e['ci_low']:.4f}, ${e['ci_high']:.4f}]"
    return f"${e['value']:.4f}{ci}"


def table(model: dict, key: str, title: str) -> list[str]:
    """One cascade's per-stage table on the check half, and its dollars per 1,000 verdicts beside each stage alone."""
    t = model[key]
    n = model["items"]["check"]
    out = [f"{model['model']}: {title} (check half, n={n} items)",
           "| stage | threshold | items judged | items left here | their agreement (exact 95% CI) | calls | USD |",
           "|---|---|---|---|---|---|---|"]
    for s in t["stages"]:
        threshold = "none" if s["threshold"] is None else f">= {s['threshold']:.3g}"
        usd = "unpriced" if s["usd"] is None else f"${s['usd']:.6f}"
        out.append(f"| {s['name']} | {threshold} | {s['reached']} | {s['left']} | {_rate(s['agreement'])} | "
                   f"{s['calls']} | {usd} |")
    given = sum(s["left"] for s in t["stages"])
    out.append(f"| to a person | | | {n - given} | | | |")
    first, last = t["stages"][0], t["stages"][-1]
    k = dict(t["per_1000"])
    if not given:  # nothing to divide by: say what was spent instead
        spent = [s["usd"] for s in t["stages"]]
        k["cascade"] = {"value": None} if None not in spent else None
        spent_text = "unpriced" if None in spent else f"${sum(spent):.6f}"
        out.append(f"no verdict given: the cascade spent {spent_text} on {n} items and sent every one to a person")
    out.append(f"coverage {_rate(t['coverage'])}; agreement of the verdicts given {_rate(t['agreement'])}. USD per "
               f"1,000 verdicts (95% bootstrap CI over items): cascade {_usd(k.get('cascade'))}; {last['name']} on "
               f"every item {_usd(k.get('last_stage'))} (agreement {_rate(last['alone'])}, {last['alone_calls']} "
               f"calls); {first['name']} on every item {_usd(k.get('first_stage'))} (agreement "
               f"{_rate(first['alone'])}, {first['alone_calls']} calls)")
    return out


def render(report: dict) -> str:
    """Both tables per model, the procedure's selection, and the embedded model's run."""
    h = report["header"]
    lines = [f"Cascade on billing fakes: {h['data']} {h['split']}; simulated referees answering (difficulty spread "
             f"1.0); level {h['level']}, risk {h['risk']}."]
    for m in report["models"]:
        sel = "; ".join(f"stage {i}: " + (f"threshold {s['threshold']:.4g}" if s["threshold"] is not None else
                                           f"not reached on {s['n_calibration']} calibration verdicts (best level "
                                           f"{s['best_level']})") for i, s in enumerate(m["chosen"]["selection"], 1))
        lines += ["", f"{m['model']}: {m['requests']} requests to the fake provider, {m['wall_seconds']:.1f} s; "
                      f"calibration half {m['items']['calibration']} items; thresholds chosen: {sel}"]
        lines += table(m, "chosen", "thresholds chosen by choose_cascade_thresholds")
        t = m["illustrative"]["thresholds"]
        lines += [""] + table(m, "illustrative", f"ILLUSTRATIVE fixed thresholds single >= {t[0]:g}, panel >= "
                                                  f"{t[1]:g} (not guaranteed)")
    e = report.get("embedded")
    if e:
        lines += ["", f"embedded model (Gemma 270M), the saved cascade (illustrative thresholds) through load(): "
                      f"{e['parsed']}/{e['items']} items parsed"]
        lines += [f"  {r['id']}: stages run {r['stages_run']}, verdict from {r['stage']}, winner {r['winner']}, "
                  f"abstained {r['abstained']}, parsed {r['parsed']}, {r['calls']} calls, {r['seconds']:.1f} s"
                  for r in e["rows"]]
    return "\n".join(lines)
