"""Compile an evaluator against human labels with DSPy's own optimizers.

Every role's ``argue``/``judge`` predictor (and the summarizer) is a separate tunable
unit, so each optimizer tunes all referees' instructions and demonstrations together.
Train on ``trainset``, select on ``valset``; the caller reports the held-out test split.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import dspy

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.program.signatures import ASPECTS
from optim.objectives import Metric, with_feedback

log = logging.getLogger(__name__)

OPTIMIZERS = ("labeled", "bootstrap", "bootstrap_rs", "mipro", "gepa", "simba")


@dataclass(frozen=True)
class OptimizerSettings:
    """Knobs shared by the optimizers (each uses those that apply to it); logged and put on the card."""

    max_demos: int = 2
    candidates: int = 4
    auto: str = "light"
    threads: int = 1
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def label_demo(example: dspy.Example, fmt: str, persona: str) -> dspy.Example:
    """A human label written as a judge's verdict, for the ``labeled`` optimizer.

    Pairwise labels become scores 8/4 (or 6/6 for a tie); mean human aspect scores are
    rounded to the nearest valid rating.
    """
    if fmt == "pairwise":
        scores = {"1": (8, 4), "2": (4, 8), "tie": (6, 6)}[example.label]
        said = {"1": "Answer 1 is better.", "2": "Answer 2 is better.", "tie": "Both answers are equally good."}
        return dspy.Example(question=example.question, answer_1=example.answer_1, answer_2=example.answer_2,
                            persona=persona, discussion="(no discussion)", evidence=f"Human referees: {said[example.label]}",
                            preference=example.label, score_1=scores[0], score_2=scores[1])
    ratings = {a: int(min(hi, max(lo, round(example.human[a])))) for a, (lo, hi) in ASPECTS.items()}
    return dspy.Example(dialogue_history=example.dialogue_history, fact=example.fact, response=example.response,
                        persona=persona, discussion="(no discussion)", evidence="Human referees' ratings.", **ratings)


class _JudgeOnly(dspy.Module):
    """Lets LabeledFewShot fill one role's judge predictor."""

    def __init__(self, judge):
        super().__init__()
        self.judge = judge


def _labeled(student: ChatEval, trainset, settings: OptimizerSettings) -> ChatEval:
    program = student.deepcopy()
    for debater in program.debate.referees.values():
        demos = [label_demo(x, program.config.format, debater.persona) for x in trainset]
        filled = dspy.LabeledFewShot(k=settings.max_demos).compile(_JudgeOnly(debater.judge), trainset=demos, sample=True)
        debater.judge.demos = filled.judge.demos
    program._compiled = True
    return program


def compile_evaluator(student: ChatEval, *, optimizer: str, trainset: Sequence[dspy.Example],
                      valset: Sequence[dspy.Example] | None, metric: Metric,
                      settings: OptimizerSettings = OptimizerSettings(),
                      reflection_lm: dspy.LM | None = None) -> ChatEval:
    """Tune ``student`` on ``trainset`` (selecting on ``valset``) and return the compiled copy.

    Args:
        student: The evaluator to tune; left unchanged.
        optimizer: One of ``OPTIMIZERS``.
        trainset: Labelled items to learn from.
        valset: Labelled items to select candidates on (optimizers that select).
        metric: ``metric(example, pred, trace=None) -> float`` (see ``optim.objectives``).
        settings: Demo counts, candidate counts, MIPRO/GEPA budget, threads, seed.
        reflection_lm: GEPA's reflection model; defaults to the LM in the current context.

    Example:
        >>> compiled = compile_evaluator(build_evaluator(cfg), optimizer="bootstrap",  # doctest: +SKIP
        ...                              trainset=parts["train"], valset=parts["dev"], metric=agreement)
    """
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
    if not trainset:
        raise ConfigError("compiling needs a non-empty train split")
    trainset, valset = list(trainset), list(valset or [])
    s = settings
    if optimizer == "labeled":
        return _labeled(student, trainset, s)
    if optimizer == "bootstrap":
        opt = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=s.max_demos, max_labeled_demos=0)
        return opt.compile(student, trainset=trainset)
    if optimizer == "bootstrap_rs":
        opt = dspy.BootstrapFewShotWithRandomSearch(metric=metric, max_bootstrapped_demos=s.max_demos,
                                                    max_labeled_demos=0, num_candidate_programs=s.candidates,
                                                    num_threads=s.threads)
        return opt.compile(student, trainset=trainset, valset=valset or None)
    if optimizer == "mipro":
        opt = dspy.MIPROv2(metric=metric, auto=s.auto, max_bootstrapped_demos=s.max_demos, max_labeled_demos=0,
                           num_threads=s.threads, seed=s.seed)
        return opt.compile(student, trainset=trainset, valset=valset or None, requires_permission_to_run=False)
    if optimizer == "gepa":
        opt = dspy.GEPA(metric=with_feedback(metric), auto=s.auto, num_threads=s.threads, seed=s.seed,
                        reflection_lm=reflection_lm or dspy.settings.lm, track_stats=True)
        return opt.compile(student, trainset=trainset, valset=valset or None)
    # SIMBA asserts that the batch fits in the train set.
    opt = dspy.SIMBA(metric=metric, bsize=min(32, len(trainset)), num_candidates=s.candidates,
                     max_steps=s.candidates, max_demos=s.max_demos, num_threads=s.threads)
    return opt.compile(student, trainset=trainset, seed=s.seed)


def optimizer_progress(program) -> list[tuple[int, float]]:
    """The dev scores the optimizer recorded on the program it returned, as ``(step, score)``.

    MIPROv2: each full evaluation by trial number; GEPA: each candidate's aggregate dev score in the
    order proposed; random search and SIMBA: their candidates, best first (they keep no order; SIMBA
    scores on the train set, having no dev set).
    Empty for optimizers that record none (labeled, bootstrap).
    """
    logs = getattr(program, "trial_logs", None)
    if isinstance(logs, dict):  # SIMBA's trial logs hold train scores only; its candidates follow below
        full = [(int(t), float(v["full_eval_score"])) for t, v in sorted(logs.items())
                if isinstance(v, dict) and v.get("full_eval_score") is not None]
        if full:
            return full
    scores = getattr(getattr(program, "detailed_results", None), "val_aggregate_scores", None)
    if scores:
        return [(i, float(x)) for i, x in enumerate(scores)]
    candidates = getattr(program, "candidate_programs", None) or []
    return [(i, float(c["score"])) for i, c in enumerate(candidates) if isinstance(c, dict) and c.get("score") is not None]
