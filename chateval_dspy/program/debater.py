"""A referee: one role with its own argument and verdict predictors."""

from __future__ import annotations

import contextlib

import dspy

from chateval_dspy.lm.bound import referee_lm
from chateval_dspy.program.roles import Role
from chateval_dspy.program.signatures import signatures_for
from chateval_dspy.program.task import TaskSpec, as_task


class Debater(dspy.Module):
    """One referee of the panel, with its own ``argue`` and ``judge`` predictors, so an optimizer tunes every role's
    instructions and demonstrations separately.

    In a mixed panel the referee runs on the LM bound to its slug (``lm.panel``); otherwise on the context's LM.

    Example:
        >>> from chateval_dspy.program.roles import resolve_roles
        >>> d = Debater(resolve_roles(["critic"], "pairwise")[0], "pairwise")
        >>> [name for name, _ in d.named_predictors()]
        ['argue', 'judge']
    """

    def __init__(self, role: Role, task: TaskSpec | str):
        super().__init__()
        task = as_task(task)
        argument, verdict = signatures_for(task)
        self.slug, self.name, self.persona = role.slug, role.name, role.persona(task)
        self.argue = dspy.Predict(argument)
        self.judge = dspy.Predict(verdict)

    def forward(self, *, final: bool, config: dict | None = None, **inputs) -> dspy.Prediction:
        predictor = self.judge if final else self.argue
        own = referee_lm(self.slug)
        # Bound per turn, by role name: the debate and the saved state never hold an LM of their own.
        with dspy.context(lm=own) if own is not None else contextlib.nullcontext():
            return predictor(persona=self.persona, config=config or {}, **inputs)
