"""Human labels written as a referee's verdicts: the demonstrations of the ``labeled`` optimizer (no LM calls)."""

from __future__ import annotations

import dspy

from chateval_dspy.errors import ConfigError
from chateval_dspy.limits import DEFAULT_DEMOS
from chateval_dspy.program.task import TaskSpec, as_task


def _points(scale) -> tuple:
    """Where a pairwise winner, loser and tie sit on a scale: 8, 4 and 6 on 1-10 (as FairEval's demos); on a label
    scale, its first label, its last, and for a tie the first."""
    if not scale.ordinal:
        return scale.labels[0], scale.labels[-1], scale.labels[0]
    span = scale.high - scale.low
    return scale.high - round(span * 0.2), scale.low + round(span * 0.3), scale.low + round(span * 0.55)


def label_demo(example: dspy.Example, task: TaskSpec | str, persona: str) -> dspy.Example | None:
    """A human label written as a judge's verdict of ``task`` (or a format's built-in task), for the ``labeled`` optimizer and
    ``ChatEvalJudge.align``.

    Pairwise: each criterion's winner, loser and tie points (``_points``), and a stated preference the label.
    Pointwise: mean human scores rounded to the nearest valid rating, labels as they are; None when a criterion has
    no human label (no whole verdict).

    Example:
        >>> demo = label_demo(dspy.Example(question="q", answer_1="a", answer_2="b", label="2"), "pairwise", "p")
        >>> demo.preference, demo.score_1, demo.score_2, demo.evidence
        ('2', 4, 8, 'Human referees: Answer 2 is better.')
    """
    task = as_task(task)
    fields = {name: example[name] for name in task.input_names}
    fields.update(persona=persona, discussion="(no discussion)")
    if task.format == "pairwise":
        label = example.label
        for c in task.criteria:
            better, worse, even = _points(c.scale)
            fields[f"{c.name}_1"], fields[f"{c.name}_2"] = {"1": (better, worse), "2": (worse, better),
                                                            "tie": (even, even)}[label]
        said = ("Both answers are equally good." if label == "tie"
                else f"{task.responses[int(label) - 1].replace('_', ' ').capitalize()} is better.")
        if task.stated_preference:
            fields["preference"] = label
        return dspy.Example(**fields, evidence=f"Human referees: {said}")
    human = example.get("human") or {}
    if any(human.get(c.name) is None for c in task.criteria):
        return None
    for c in task.criteria:
        value = human[c.name]
        fields[c.name] = int(min(c.scale.high, max(c.scale.low, round(value)))) if c.scale.ordinal else value
    return dspy.Example(**fields, evidence="Human referees' ratings.")


class _JudgeOnly(dspy.Module):
    """Lets LabeledFewShot fill one role's judge predictor."""

    def __init__(self, judge):
        super().__init__()
        self.judge = judge


def with_label_demos(program, items, *, k: int = DEFAULT_DEMOS):
    """A copy of ``ChatEval`` ``program`` whose every referee's judge predictor holds up to ``k`` of ``items``'
    human labels, written as verdicts (``label_demo``): the ``labeled`` optimizer, which calls no LM.

    Each referee samples its ``k`` with DSPy's ``LabeledFewShot`` (seeded, so the same items give the same demos).

    Example:
        >>> from chateval_dspy.program.chateval import build_evaluator
        >>> from chateval_dspy.config import DebateConfig
        >>> tuned = with_label_demos(build_evaluator(DebateConfig(roles=("critic",), turns=1)),
        ...                          [dspy.Example(id="1", question="q", answer_1="a", answer_2="b", label="1")], k=1)
        >>> [len(p.demos) for _, p in tuned.named_predictors()]
        [0, 1]
    """
    program = program.deepcopy()
    task = program.config.task_spec
    for debater in program.debate.referees.values():
        demos = [d for d in (label_demo(x, task, debater.persona) for x in items) if d is not None]
        if not demos:
            raise ConfigError(f"labelled demos need items with a human label for every criterion of task "
                              f"{task.name!r}; none of the {len(items)} given has them all")
        filled = dspy.LabeledFewShot(k=k).compile(_JudgeOnly(debater.judge), trainset=demos, sample=True)
        debater.judge.demos = filled.judge.demos
    program._compiled = True
    return program
