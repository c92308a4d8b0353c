"""The agreement suite: every configuration of the paper on one model and one split, against the single agent.

Rows are the majority-class baseline (no LM), the single agent (1 role, 1 turn), the single
agent with position calibration, FairEval's MEC+BPC, ChatEval in its three strategies, 1-5
roles, 1-4 turns, the same-role ablation, consensus stop, a compiled program (``--program``)
and, for Topical-Chat, the paper's reference-based baselines (ROUGE-L, BLEU-4, BERTScore).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import dspy

from chateval_dspy.aggregate import pairwise_verdict, scoring_verdict
from chateval_dspy.calibration import consistent
from chateval_dspy.config import DebateConfig
from chateval_dspy.data import load_dataset, select
from chateval_dspy.errors import ConfigError
from chateval_dspy.metrics import pairwise_report, scoring_report
from chateval_dspy.program import build_evaluator
from chateval_dspy.roles import first_roles, same_roles
from chateval_dspy.signatures import ASPECTS
from optim import bench
from optim.bench_stats import as_dict, mcnemar, paired_correlation_delta

REFERENCE = "single"


@dataclass(frozen=True)
class Entry:
    """One row: a debate config, MEC over the single agent, a compiled program, or a baseline without an LM."""

    name: str
    label: str
    kind: str  # debate | mec | compiled | majority | text
    config: DebateConfig | None = None


def catalogue(fmt: str, *, mec_k: int = 3) -> dict[str, Entry]:
    """Every configuration the suite knows for a format, by name."""
    c = DebateConfig(format=fmt)
    single = c.replace(roles=first_roles(1), turns=1, calibrate=False)
    entries = [Entry("majority", "majority class (no LM)", "majority") if fmt == "pairwise" else None,
               Entry("single", "single agent (1 role, 1 turn)", "debate", single)]
    if fmt == "pairwise":
        entries += [Entry("single_calibrated", "single agent + position calibration", "debate", single.replace(calibrate=True)),
                    Entry("mec_bpc", f"FairEval MEC+BPC (k={mec_k}, T=1)", "mec", single.replace(calibrate=True))]
    else:
        entries += [Entry("mec_bpc", f"MEC (k={mec_k}, T=1; no BPC in scoring)", "mec", single)]
    entries += [Entry("chateval", "ChatEval one-by-one (2 roles, 2 turns)", "debate", c),
                Entry("simultaneous_talk", "ChatEval simultaneous-talk", "debate", c.replace(strategy="simultaneous_talk")),
                Entry("summarizer", "ChatEval simultaneous-talk-with-summarizer", "debate",
                      c.replace(strategy="simultaneous_talk_with_summarizer")),
                Entry("same_role", "ChatEval, same role for both referees", "debate", c.replace(roles=same_roles(2))),
                Entry("consensus_stop", "ChatEval + consensus stop", "debate", c.replace(consensus_stop=True))]
    entries += [Entry(f"roles_{n}", f"ChatEval, {n} role{'s' * (n > 1)}", "debate", c.replace(roles=first_roles(n)))
                for n in (1, 3, 4, 5)]
    entries += [Entry(f"turns_{t}", f"ChatEval, {t} turn{'s' * (t > 1)}", "debate", c.replace(turns=t)) for t in (1, 3, 4)]
    if fmt == "scoring":
        entries += [Entry("rouge_l", "ROUGE-L vs the original response (no LM)", "text"),
                    Entry("bleu_4", "BLEU-4 vs the original response (no LM)", "text"),
                    Entry("bertscore", "BERTScore F1, MiniLM-L6 (no LM)", "text")]
    return {e.name: e for e in entries if e is not None}


CONFIG_SETS = {
    "quick": ["majority", "single", "single_calibrated", "mec_bpc", "chateval", "consensus_stop", "rouge_l", "bleu_4"],
    "paper": ["majority", "single", "single_calibrated", "mec_bpc", "chateval", "simultaneous_talk", "summarizer",
              "same_role", "consensus_stop", "rouge_l", "bleu_4", "bertscore"],
    "grid": ["majority", "single", "chateval", "roles_1", "roles_3", "roles_4", "roles_5", "turns_1", "turns_3", "turns_4"],
    "cost": ["single", "single_calibrated", "chateval", "consensus_stop"],
}


def choose(spec: str, fmt: str, *, mec_k: int = 3, bertscore: bool = False) -> list[Entry]:
    """The entries named by ``--configs`` (a set, ``all``, or names); the single agent is always included."""
    known = catalogue(fmt, mec_k=mec_k)
    if spec == "all":
        names = list(known)
    elif spec in CONFIG_SETS:
        names = CONFIG_SETS[spec]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"unknown configuration(s) {unknown} for {fmt}; choose from: {', '.join(known)} "
                              f"or a set: all, {', '.join(CONFIG_SETS)}")
    if "bertscore" in names and not bertscore:
        names = [n for n in names if n != "bertscore"]
    names = [n for n in names if n in known]
    if REFERENCE not in names:
        names.insert(0, REFERENCE)
    return [known[n] for n in dict.fromkeys(names)]


def list_configs(dataset: str) -> str:
    fmt = load_dataset(dataset)[1]
    lines = [f"{e.name:20s} {e.label}" for e in catalogue(fmt).values()]
    lines += [f"set {k}: {', '.join(v)}" for k, v in CONFIG_SETS.items()]
    return "\n".join(lines)


class MultipleEvidence(dspy.Module):
    """FairEval's Multiple Evidence Calibration: ``k`` samples of one program at temperature ``T``, scores averaged.

    Over a position-calibrated single agent this is MEC+BPC (Wang et al., 2023): each sample judges both
    answer orders. Samples run under ``lm.copy(rollout_id=i, temperature=T)``, so a cache never merges them.

    Example:
        >>> mec = MultipleEvidence(build_evaluator(DebateConfig(roles=("critic",), turns=1)), k=3)
    """

    def __init__(self, program: dspy.Module, k: int = 3, temperature: float = 1.0):
        super().__init__()
        self.program, self.k, self.temperature = program, k, temperature

    def forward(self, **inputs) -> dspy.Prediction:
        lm = dspy.settings.lm
        samples = []
        for i in range(self.k):
            with dspy.context(lm=lm.copy(rollout_id=i + 1, temperature=self.temperature)):
                samples.append(self.program(**inputs))
        fmt = self.program.config.format
        verdicts = [v for s in samples for per_order in s.referees.values() for v in per_order]
        referees = {f"{slug}#{i + 1}": per_order for i, s in enumerate(samples) for slug, per_order in s.referees.items()}
        abstentions = {f"sample{i + 1}:{k}": v for i, s in enumerate(samples) for k, v in s.abstentions.items()}
        common = {"referees": referees, "transcripts": [t for s in samples for t in s.transcripts],
                  "abstentions": abstentions, "calls": sum(s.calls for s in samples)}
        if fmt == "pairwise":
            per_order = []
            for j in range(max(len(p) for s in samples for p in s.referees.values())):
                shown = [p[j] for s in samples for p in s.referees.values() if len(p) > j]
                per_order.append(pairwise_verdict(shown, "mean")[0])
            pref, means = pairwise_verdict(verdicts, "mean")
            return dspy.Prediction(preference=pref, score_1=means["score_1"] if means else None,
                                   score_2=means["score_2"] if means else None, order_preferences=per_order,
                                   consistent=consistent(*per_order) if len(per_order) == 2 else None,
                                   abstained=None if pref else "no_verdict", **common)
        scores = scoring_verdict(verdicts, "mean")
        return dspy.Prediction(**{a: (scores[a] if scores else None) for a in ASPECTS}, consistent=None,
                               abstained=None if scores else "no_verdict", **common)


def _program(entry: Entry, args):
    if entry.kind == "mec":
        return MultipleEvidence(build_evaluator(entry.config), k=args.mec_k), entry.config
    if entry.kind == "compiled":
        from chateval_dspy.evaluator import load_evaluator

        program, _ = load_evaluator(args.program)
        return program, program.config
    return build_evaluator(entry.config), entry.config


def _row(entry: Entry, fmt: str, items, predictions: dict, cost: dict | None = None, seed: int = 0) -> dict:
    ids = [str(x.id) for x in items]
    if fmt == "pairwise":
        human = [x.label for x in items]
        metrics = pairwise_report(human, [predictions.get(i) for i in ids], seed=seed)
    else:
        human = [x.human for x in items]
        metrics = scoring_report(human, [predictions.get(i) for i in ids], seed=seed)
    return {"name": entry.name, "label": entry.label, "kind": entry.kind,
            "config": entry.config.to_dict() if entry.config else None,
            "n": len(ids), "metrics": {k: as_dict(v) if hasattr(v, "low") else v for k, v in metrics.items()},
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


def _significance(rows: list[dict], fmt: str, items, seed: int) -> None:
    ref = next(r for r in rows if r["name"] == REFERENCE)
    if fmt == "pairwise":
        labels = {str(x.id): x.label for x in items}
        correct = {r["name"]: {i: r["predictions"].get(i) == labels[i] for i in labels} for r in rows}
        for r in rows:
            r["vs_single"] = None if r is ref else mcnemar(correct[REFERENCE], correct[r["name"]])
        return
    human = {str(x.id): x.human for x in items}
    for r in rows:
        r["vs_single"] = None if r is ref else paired_correlation_delta(human, ref["predictions"], r["predictions"], seed=seed)


def agreement_key(entry: Entry, cfg: DebateConfig, model: str, args) -> str:
    """The run key of one row's results file (without the item limit, so a larger --limit resumes)."""
    return bench.run_key(suite="agreement", entry=entry.name, kind=entry.kind, config=cfg.changes(), model=model,
                         dataset=args.dataset, split=args.split, seed=args.seed,
                         mec_k=args.mec_k if entry.kind == "mec" else None,
                         program=str(args.program) if entry.kind == "compiled" else None)


def run_agreement(args, factory: bench.LMFactory) -> dict:
    """Judge the split with every chosen configuration; write the figures JSON; return it with its tables."""
    all_items, fmt = load_dataset(args.dataset)
    items = select(all_items, args.split, seed=args.seed, limit=args.limit)
    entries = choose(args.configs, fmt, mec_k=args.mec_k, bertscore=args.bertscore)
    if args.program:
        from chateval_dspy.evaluator import read_card

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
                program, cfg = _program(entry, args)
                if cfg.format != fmt:
                    raise ConfigError(f"{entry.name}: a {cfg.format} program cannot judge {args.dataset} ({fmt})")
                key = agreement_key(entry, cfg, model, args)
                run = bench.run_config(program, items, cfg, out=base / f"{entry.name}.jsonl", key=key,
                                       concurrency=args.concurrency, meter=meter)
                preds = {str(r["id"]): r["prediction"] for r in run.records}
                rows.append(_row(entry, fmt, items, preds, _cost(run), args.seed))
    for entry in entries:
        if entry.kind == "majority":
            train = select(all_items, "train", seed=args.seed) if args.split != "train" else items
            top = Counter(x.label for x in train).most_common(1)[0][0]
            rows.append(_row(entry, fmt, items, {str(x.id): top for x in items}, None, args.seed))
        elif entry.kind == "text":
            from optim.bench_text import text_scores

            scores, note = text_scores(entry.name, items, all_items)
            if scores is None:
                print(f"bench: skipping {entry.name}: {note}", file=sys.stderr)
                continue
            preds = {i: {a: s for a in ASPECTS} for i, s in scores.items()}
            row = _row(entry, fmt, items, preds, None, args.seed)
            row["note"] = note
            rows.append(row)
    order = [e.name for e in entries]
    rows.sort(key=lambda r: order.index(r["name"]))
    _significance(rows, fmt, items, args.seed)
    report = {"header": bench.header(args, suite="agreement", model=model, data=args.dataset,
                                     split=f"{args.split} (seed {args.seed})", n=len(items), limit=args.limit, format=fmt),
              "rows": rows}
    path = bench.write_json(args.out or bench.BENCH_DIR / f"agreement-{args.dataset}.json", report)
    return {**report, "path": str(path)}

