"""The prompts, as DSPy signatures built from a task spec (``task.TaskSpec``).

Each signature's instructions are the text an optimizer rewrites. Personas and the visible discussion are input
fields, so every role shares these signatures while holding its own predictors; fields run from most to least shared
for the providers' prompt caches (docs/architecture.md, "Prompts"). Scored outputs are ``Literal`` types of the
criterion's scale. The built-in tasks' signatures (``PairwiseVerdict``, ...) are built from ``tasks/*.yaml``, their
prompts byte for byte those the benchmarks were measured with.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import dspy

from chateval_dspy.program.task import DATA_NOTE, TaskSpec, as_task, builtin_task

Preference = Literal["1", "2", "tie"]
PREFERENCES = ("1", "2", "tie")


class Summarize(dspy.Signature):
    """Condense a panel discussion into a short neutral summary: the points made for and
    against, and where the referees agree or disagree. Do not add opinions of your own."""

    material: str = dspy.InputField(desc="what the panel is judging. " + DATA_NOTE)
    discussion: str = dspy.InputField(desc="the discussion to summarise")
    summary: str = dspy.OutputField(desc="at most five sentences")


# A built-in task's signature names keep the old "Scoring" for pointwise: a verdict's name is sent to the LM
# (the JSON schema's name), so renaming it would change every request and miss every cached answer.
_BUILTIN_NAMES = {"pairwise": "Pairwise", "pointwise": "Scoring"}


def _class_name(task: TaskSpec, step: str) -> str:
    if task == builtin_task(task.format):
        return f"{_BUILTIN_NAMES[task.format]}{step}"  # PairwiseVerdict, ScoringArgument: the names they had
    return "".join(part.capitalize() for part in task.name.split("_")) + step


def _inputs(task: TaskSpec) -> dict:
    fields = {}
    for inp in task.inputs:
        desc = f"{inp.description} {DATA_NOTE}" if inp.description else DATA_NOTE
        fields[inp.name] = (str, dspy.InputField(desc=desc))
    fields["discussion"] = (str, dspy.InputField(desc="what the panel has said so far"))
    fields["persona"] = (str, dspy.InputField(desc="who you are as a referee"))
    return fields


def _output(desc: str):
    # No description at all (not an empty one) when the instructions describe the criterion: DSPy then shows none.
    return dspy.OutputField(desc=desc) if desc else dspy.OutputField()


def signatures_for(task: TaskSpec | str) -> tuple[type[dspy.Signature], type[dspy.Signature]]:
    """``(argument, verdict)`` signatures of a task (or of a format's built-in task), built once per spec.

    Example:
        >>> argue, verdict = signatures_for("pairwise")
        >>> list(verdict.output_fields), verdict.__name__
        (['evidence', 'preference', 'score_1', 'score_2'], 'PairwiseVerdict')
    """
    return _build(as_task(task))


@lru_cache(maxsize=64)
def _build(task: TaskSpec) -> tuple[type[dspy.Signature], type[dspy.Signature]]:
    # One pair of classes per spec: every referee's predictors share them, and the adapter memoises per class.
    argue = dspy.make_signature(
        {**_inputs(task), "argument": (str, dspy.OutputField(desc="your turn in the discussion"))},
        task.argue_instructions, signature_name=_class_name(task, "Argument"))
    outputs = {"evidence": (str, dspy.OutputField(desc=task.evidence))}
    if task.stated_preference:
        outputs["preference"] = (Preference, dspy.OutputField(desc=task.preference.stated))
    described = task.criteria_in == "fields"
    for c in task.criteria:
        kind = Literal[c.scale.values]  # Literal[(1, 2, 3)] is Literal[1, 2, 3]
        if task.format == "pairwise":
            for n in (1, 2):
                outputs[f"{c.name}_{n}"] = (kind, _output(task.describe(c, n) if described else ""))
        else:
            outputs[c.name] = (kind, _output(task.describe(c) if described else ""))
    verdict = dspy.make_signature({**_inputs(task), **outputs}, task.verdict_instructions,
                                  signature_name=_class_name(task, "Verdict"))
    return argue, verdict


class ScoreRangeError(ValueError):
    """A verdict whose preference or score lies outside its scale (a bad output, never a bad input)."""


def check_verdict(task: TaskSpec | str, verdict: dict) -> dict:
    """Pull the scored fields (and a stated preference) out of a verdict and check each against its scale.

    DSPy enforces the Literal types, but a custom adapter or a demo edited by hand can bypass that;
    a value off its scale is an error here, not a silent clamp.

    Example:
        >>> check_verdict("pairwise", {"score_1": 7, "score_2": 3, "preference": "1", "evidence": "..."})
        {'preference': '1', 'score_1': 7, 'score_2': 3}
    """
    task = as_task(task)
    out = {}
    if task.stated_preference:
        if verdict.get("preference") not in PREFERENCES:
            raise ScoreRangeError(f"preference={verdict.get('preference')!r} is not one of 1, 2, tie")
        out["preference"] = verdict["preference"]
    for name in task.output_fields:
        scale, value = task.scale_of(name), verdict.get(name)
        if not scale.accepts(value):
            what = f"one of {', '.join(scale.labels)}" if scale.labels else f"an integer in {scale.low}..{scale.high}"
            raise ScoreRangeError(f"{name}={value!r} is not {what}")
        out[name] = value
    return out
