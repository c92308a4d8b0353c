"""The configurations the suites judge, by name, and FairEval's Multiple Evidence Calibration."""

from __future__ import annotations

from dataclasses import dataclass

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.aggregate import pairwise_verdict, pointwise_verdict
from chateval_dspy.program.calibration import consistent
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import first_roles, same_roles
from chateval_dspy.program.task import builtin_task

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
        entries += [Entry("mec_bpc", f"MEC (k={mec_k}, T=1; no BPC in pointwise)", "mec", single)]
    entries += [Entry("chateval", "ChatEval one-by-one (2 roles, 2 turns)", "debate", c),
                Entry("simultaneous_talk", "ChatEval simultaneous-talk", "debate", c.replace(strategy="simultaneous_talk")),
                Entry("summarizer", "ChatEval simultaneous-talk-with-summarizer", "debate",
                      c.replace(strategy="simultaneous_talk_with_summarizer")),
                Entry("same_role", "ChatEval, same role for both referees", "debate", c.replace(roles=same_roles(2))),
                Entry("consensus_stop", "ChatEval + consensus stop", "debate", c.replace(consensus_stop=True))]
    entries += [Entry(f"roles_{n}", f"ChatEval, {n} role{'s' * (n > 1)}", "debate", c.replace(roles=first_roles(n)))
                for n in (1, 3, 4, 5)]
    entries += [Entry(f"turns_{t}", f"ChatEval, {t} turn{'s' * (t > 1)}", "debate", c.replace(turns=t)) for t in (1, 3, 4)]
    if fmt == "pointwise":
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
            per_order = [pairwise_verdict([p[j] for s in samples for p in s.referees.values() if len(p) > j], "mean")[0]
                         for j in range(max(len(p) for s in samples for p in s.referees.values()))]
            pref, means = pairwise_verdict(verdicts, "mean")
            return dspy.Prediction(preference=pref, score_1=means["score_1"] if means else None,
                                   score_2=means["score_2"] if means else None, order_preferences=per_order,
                                   consistent=consistent(*per_order) if len(per_order) == 2 else None,
                                   abstained=None if pref else "no_verdict", **common)
        scores = pointwise_verdict(verdicts, "mean")
        aspects = builtin_task("pointwise").ordinal_ranges  # Topical-Chat's criteria
        return dspy.Prediction(**{a: (scores[a] if scores else None) for a in aspects}, consistent=None,
                               abstained=None if scores else "no_verdict", **common)


def program_for(entry: Entry, args):
    """The program and config that judge ``entry`` (MEC wraps the single agent; ``compiled`` loads ``args.program``)."""
    if entry.kind == "mec":
        return MultipleEvidence(build_evaluator(entry.config), k=args.mec_k), entry.config
    if entry.kind == "compiled":
        from chateval_dspy.deploy.saved.store import load_program

        program, _ = load_program(args.program)
        return program, program.config
    return build_evaluator(entry.config), entry.config


