"""The review suite: does the uncertainty flag find the panel's errors, and are flagged items the better labels?

Two measurements of ``optim.review.uncertainty``: flag precision (wrong verdicts among the top ``k`` by ``U``
against the rest, and the AUC; ties in ``U`` are broken by a hash of the item id, so the table also gives the top
share averaged over the items tied at the cut) and label efficiency (labels in queue order against random ones,
compiled into every referee's demos). ``--planted`` uses a fake LM whose signal is known (the embedded model has no
judging signal). Method and figures: benchmarks/review.md.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_faireval
from chateval_dspy.data.splits import select
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import first_roles
from chateval_dspy.run.identity import digest
from chateval_dspy.run.metrics import accuracy, bootstrap
from chateval_dspy.testing.fake_lm import FIELD, Call, default_responder, fake_lm
from optim.bench import common as bench
from optim.bench.stats import proportion
from optim.review.uncertainty import rank
from optim.tuning.compile import OptimizerSettings, compile_evaluator
from optim.tuning.objectives import agreement

FRACTIONS = (0.1, 0.2, 0.4)
HARD = ("fermi", "counterfactual", "roleplay", "coding", "math")  # the planted LM's hard categories (40 of 80 items)


# --- a fake LM with a known signal ---------------------------------------------------------------------------------

def planted_responder(items) -> Callable[[Call], dict]:
    """A fake referee that is right on easy items and position-biased on hard ones, unless a demo taught it.

    On an item of an easy category it gives the human verdict (8 vs 4, or 6 vs 6 for a tie) in either answer
    order. On an item of a ``HARD`` category it prefers whichever answer is shown first (7 vs 5), so the two
    orders disagree (``consistent: false``) and the pooled verdict is a tie: wrong unless people said tie; but
    if one of its demos is an item of the same category, it gives the human verdict there too.
    """
    by_question = {x.question.strip(): x for x in items}

    def responder(call: Call) -> dict:
        item = by_question.get(call.inputs.get("question", ""))
        if call.kind != "verdict" or item is None or "score_1" not in call.outputs:
            return default_responder(call)
        taught = {by_question[q.strip()].category for role, text in call.history if role == "user"
                  for name, q in FIELD.findall(text) if name == "question" and q.strip() in by_question}
        if item.category in HARD and item.category not in taught:
            return {"evidence": "the first answer reads better", "preference": "1", "score_1": 7, "score_2": 5}
        shown = call.inputs.get("answer_1", "")
        first_is_1 = len(os.path.commonprefix([shown, item.answer_1.strip()])) >= len(
            os.path.commonprefix([shown, item.answer_2.strip()]))
        winner = {"tie": "tie", "1": "1" if first_is_1 else "2", "2": "2" if first_is_1 else "1"}[item.label]
        s1, s2 = {"tie": (6, 6), "1": (8, 4), "2": (4, 8)}[winner]
        return {"evidence": "as people judge it", "preference": winner, "score_1": s1, "score_2": s2}

    return responder


def planted_factory(items) -> bench.LMFactory:
    lm = fake_lm(planted_responder(items))
    return lambda slots: contextlib.nullcontext(lm)


# --- the figures -----------------------------------------------------------------------------------------------------

def wrong(record: dict) -> bool:
    """A verdict is wrong when it is not the human label (an abstention is wrong)."""
    return record.get("prediction") != record.get("human")


def auc(scores, is_wrong) -> float:
    """P(a wrong item's U > a right item's), ties one half; NaN without both kinds.

    Example:
        >>> auc([0.9, 0.5, 0.5, 0.1], [True, True, False, False])
        0.875
    """
    scores, is_wrong = np.asarray(scores, dtype=float), np.asarray(is_wrong, dtype=bool)
    w, r = scores[is_wrong], scores[~is_wrong]
    if not len(w) or not len(r):
        return float("nan")
    return float(((w[:, None] > r[None, :]).sum() + 0.5 * (w[:, None] == r[None, :]).sum()) / (len(w) * len(r)))


def flag_precision(records: list[dict], fractions=FRACTIONS, seed: int = 0, n_resamples: int | None = None) -> dict:
    """Wrong verdicts among the top ``k`` by ``U`` (queue order) against the rest, for each fraction of items."""
    ranked = rank(records)
    u = [x.score for _, x in ranked]
    bad = [wrong(r) for r, _ in ranked]
    n, rows = len(ranked), []
    for f in fractions:
        k = max(1, round(f * n))
        a, b = sum(bad[:k]), sum(bad[k:])
        cut = u[k - 1]
        above, tied = [i for i in range(n) if u[i] > cut], [i for i in range(n) if u[i] == cut]
        tied_wrong = sum(bad[i] for i in tied) / len(tied)
        expected = (sum(bad[i] for i in above) + (k - len(above)) * tied_wrong) / k
        p = stats.fisher_exact([[a, k - a], [b, n - k - b]])[1] if k < n else float("nan")
        rows.append({"fraction": f, "k": k, "top": proportion(a, k), "rest": proportion(b, n - k),
                     "top_tie_averaged": expected, "tied_at_cut": len(tied), "tied_in_top": k - len(above),
                     "fisher_p": float(p)})
    return {"n": n, "wrong": proportion(sum(bad), n), "distinct_scores": len(set(u)),
            "auc": bootstrap(auc, u, bad, seed=seed, n_resamples=n_resamples).to_dict(), "rows": rows,
            "queue": [{"id": r["id"], "u": x.score, "wrong": w} for (r, x), w in zip(ranked, bad)]}


def label_orders(pool: list[dict], seeds: int, seed: int, tie_draws: int = 0) -> dict[str, list[str]]:
    """The pool's ids in queue order, in ``seeds`` random orders, and in ``tie_draws`` queue orders whose ties in
    ``U`` are broken at random (the queue itself orders equal scores by a hash of the item id).

    Example:
        >>> pool = [{"id": "a", "format": "pairwise"}, {"id": "b", "format": "pairwise", "consistent": False}]
        >>> label_orders(pool, 1, 0)["queue"]
        ['b', 'a']
    """
    ranked = rank(pool)
    ids = [str(r["id"]) for r, _ in ranked]
    orders = {"queue": ids}
    for s in range(seeds):
        shuffled = ids.copy()
        random.Random(f"review-{seed}-{s}").shuffle(shuffled)
        orders[f"random_{s}"] = shuffled
    for s in range(tie_draws):
        rng = random.Random(f"review-ties-{seed}-{s}")
        orders[f"ties_{s}"] = [str(r["id"]) for r, _ in sorted(ranked, key=lambda pair: (-pair[1].score, rng.random()))]
    return orders


# --- the suite -------------------------------------------------------------------------------------------------------

def panel(args) -> DebateConfig:
    return DebateConfig(format="pairwise", roles=first_roles(args.roles), turns=args.turns, calibrate=True,
                        aggregate=args.aggregate)


def run_review(args, factory: bench.LMFactory | None = None) -> dict:
    """Judge the pool and the test slice, rank, compile from labels in both orders; write the figures JSON."""
    all_items = load_faireval()
    factory = planted_factory(all_items) if args.planted else factory
    pool = select(all_items, "train", seed=args.seed, limit=args.pool_limit)
    test = select(all_items, "test", seed=args.seed, limit=args.test_limit)
    curve_test = test[:args.curve_test_limit] if args.curve_test_limit else test
    cfg, by_id = panel(args), {str(x.id): x for x in all_items}
    top = Counter(x.label for x in select(all_items, "train", seed=args.seed)).most_common(1)[0][0]
    counts = [int(c) for c in args.counts.split(",") if c.strip() and 0 < int(c) <= len(pool)]
    wanted_random = args.counts if args.random_counts is None else args.random_counts
    random_counts = [int(c) for c in wanted_random.split(",") if c.strip() and int(c) in counts]
    with bench.judging(factory) as lm:
        model = "fake/planted" if args.planted else lm.model
        shape = f"r{len(cfg.roles)}-t{cfg.turns}-{cfg.aggregate}"
        base = Path(args.work_dir) / f"review-faireval-s{args.seed}-{bench.slug(model)}-{shape}"
        meter = bench.attach_meter(lm)

        def judged(program, items, name: str, **key) -> bench.ConfigRun:
            k = bench.bench_key(suite="review", config=cfg.changes(), model=model, seed=args.seed, **key)
            return bench.run_config(program, items, cfg, out=base / f"{name}.jsonl", key=k, meter=meter)

        plain_runs = {part: judged(build_evaluator(cfg), items, f"uncompiled-{part}", part=part)
                      for part, items in (("pool", pool), ("test", test))}
        records = plain_runs["pool"].records + plain_runs["test"].records
        flags = flag_precision(records, seed=args.seed, n_resamples=args.resamples)
        curve = None
        if counts:
            orders = label_orders(plain_runs["pool"].records, args.seeds, args.seed, args.tie_draws)
            wanted = {str(x.id) for x in curve_test}
            zero = [r for r in plain_runs["test"].records if str(r["id"]) in wanted]
            curve = {"counts": counts, "random_counts": random_counts, "orders": {},
                     "base": _accuracy(zero, curve_test, args.seed, top, args.resamples)}
            for name, order in orders.items():
                points = []
                for m in counts if name == "queue" else random_counts:  # ties_*: at the random counts too
                    ids = sorted(order[:m])
                    program = compile_evaluator(build_evaluator(cfg), optimizer=args.optimizer,
                                                trainset=[by_id[i] for i in ids], valset=None, metric=agreement,
                                                settings=OptimizerSettings(max_demos=m, seed=args.seed))
                    run = judged(program, curve_test, f"labels-{args.optimizer}-m{m}-{digest(ids)}",
                                 labels=ids, optimizer=args.optimizer)
                    points.append({"m": m, "labels": ids, **_accuracy(run.records, curve_test, args.seed, top,
                                                                                 args.resamples)})
                curve["orders"][name] = points
            for kind in ("random", "ties"):
                draws = [v for k, v in curve["orders"].items() if k.startswith(f"{kind}_")]
                curve[kind] = _random_mean(draws, args.seed, args.resamples)
    what = (f"{len(cfg.roles)} referee(s) ({', '.join(cfg.roles)}), {cfg.turns} turn(s), both answer orders, "
            f"aggregate {cfg.aggregate}")
    header = bench.header(args, suite="review", model=model, data="faireval",
                          split=f"train (pool, {len(pool)}) + test ({len(test)}) (seed {args.seed})",
                          n=len(records), panel=what, optimizer=args.optimizer,
                          curve_split=f"test, first {len(curve_test)} items", seeds=args.seeds,
                          tie_draws=args.tie_draws)
    report = {"header": header, "flags": flags, "labels": curve}
    out = Path(args.out or bench.BENCH_DIR / f"review-{'planted' if args.planted else 'faireval'}.json")
    path = bench.write_json(out, report)
    drawn = plots(report, out.parent, out.stem.removeprefix("review-"))
    return {**report, "path": str(path), "plots": [str(p) for p in drawn]}


def _accuracy(records: list[dict], items, seed: int, top: str, n_resamples: int | None = None) -> dict:
    """Accuracy on ``items`` with its bootstrap CI (no kappa: its resampling would dominate the fake LM's runs),
    beside always answering ``top`` (the train split's majority label)."""
    preds = {str(r["id"]): r["prediction"] for r in records}
    human = [x.label for x in items]
    return {"n": len(items), "accuracy": bootstrap(accuracy, human, [preds.get(str(x.id)) for x in items],
                                                   seed=seed, n_resamples=n_resamples).to_dict(),
            "majority_accuracy": bootstrap(accuracy, human, [top] * len(human), seed=seed,
                                           n_resamples=n_resamples).to_dict()}


def _random_mean(curves: list[list[dict]], seed: int, n_resamples: int | None = None) -> list[dict]:
    """Per label count: mean accuracy over the random draws, with a bootstrap CI over the draws."""
    out = []
    for points in zip(*curves):  # one tuple of draws per label count
        accs = [p["accuracy"]["value"] for p in points]
        est = bootstrap(lambda a: float(np.mean(a.astype(float))), accs, seed=seed, n_resamples=n_resamples)
        out.append({"m": points[0]["m"], "draws": len(accs), "accuracy": est.to_dict()})
    return out


# --- plots -------------------------------------------------------------------------------------------------

def plots(report: dict, directory: Path, name: str) -> list[Path]:
    """``review-flags-<name>.png`` and ``review-labels-<name>.png``."""
    from optim.bench.png import pyplot, save

    plt = pyplot()
    h, written = report["header"], []
    sub = f"{h['model']} | faireval {h['split']} | {h['date']}"

    def err(e):
        low, high = e.get("ci_low"), e.get("ci_high")
        defined = low is not None and high is not None and low == low and high == high  # null / NaN: no CI
        return [[e["value"] - low], [high - e["value"]]] if defined else None

    if report.get("flags"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, r in enumerate(report["flags"]["rows"]):
            for dx, key, color in ((-0.15, "top", "C3"), (0.15, "rest", "C0")):
                e = r[key]
                ax.errorbar([i + dx], [e["value"]], yerr=err(e), fmt="o", color=color, capsize=4,
                            label=("flagged (top k)" if key == "top" else "the rest") if i == 0 else None)
        ax.set_xticks(range(len(report["flags"]["rows"])),
                      [f"top {r['fraction']:.0%} (k={r['k']})" for r in report["flags"]["rows"]])
        ax.set_ylabel("share of wrong verdicts (95% CI)")
        ax.set_title(f"Does the flag find the errors? n={report['flags']['n']}\n{sub}", fontsize=8)
        ax.legend(fontsize=8)
        written.append(save(fig, directory / f"review-flags-{name}.png", plt))
    c = report.get("labels")
    if c:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, points, color in (("queue order (ties in file order)", c["orders"]["queue"], "C3"),
                                   (f"queue order, ties at random (mean of {h.get('tie_draws', 0)} draws)",
                                    c.get("ties", []), "C1"),
                                   (f"random order (mean of {h['seeds']} draws)", c["random"], "C0")):
            if not points:
                continue
            bars = np.array([err(p["accuracy"]) or [[0], [0]] for p in points], dtype=float)[:, :, 0].T
            ax.errorbar([p["m"] for p in points], [p["accuracy"]["value"] for p in points], yerr=bars, fmt="o-",
                        color=color, capsize=4, label=key)
        ax.axhline(c["base"]["accuracy"]["value"], color="grey", ls="--", label="uncompiled panel")
        ax.set_xscale("log", base=2)
        ax.set_xticks(c["counts"], [str(m) for m in c["counts"]])
        ax.set_xlabel(f"labels (pool items given their human label; {h['optimizer']})")
        ax.set_ylabel(f"accuracy on {h['curve_split']} (95% CI)")
        ax.set_title(f"Label efficiency: queue order vs random\n{sub}", fontsize=8)
        ax.legend(fontsize=8)
        written.append(save(fig, directory / f"review-labels-{name}.png", plt))
    return written
