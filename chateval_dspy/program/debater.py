"""A referee: one role with its own argument and verdict predictors."""

from __future__ import annotations

import dspy

from chateval_dspy.program.roles import Role
from chateval_dspy.program.signatures import SIGNATURES


class Debater(dspy.Module):
    """One referee of the panel.

    Each debater builds its own ``argue`` and ``judge`` predictors, so an optimizer
    tunes every role's instructions and demonstrations separately
    (``referees['critic'].argue``, ``referees['critic'].judge`` in ``named_predictors()``).

    Args:
        role: Who this referee is.
        fmt: ``pairwise`` or ``scoring``; picks the signatures and the persona text.

    Example:
        >>> from chateval_dspy.program.roles import resolve_roles
        >>> d = Debater(resolve_roles(["critic"], "pairwise")[0], "pairwise")
        >>> [name for name, _ in d.named_predictors()]
        ['argue', 'judge']
    """

    def __init__(self, role: Role, fmt: str):
        super().__init__()
        argument, verdict = SIGNATURES[fmt]
        self.slug, self.name, self.persona = role.slug, role.name, role.persona(fmt)
        self.argue = dspy.Predict(argument)
        self.judge = dspy.Predict(verdict)

    def forward(self, *, final: bool, config: dict | None = None, **inputs) -> dspy.Prediction:
        predictor = self.judge if final else self.argue
        return predictor(persona=self.persona, config=config or {}, **inputs)
