"""Which LM each referee of the current context runs on (a mixed panel binds them by role slug, ``lm.panel``).

A module of its own, below the engines: the circuit breaker reads it to know every endpoint a call may reach.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import dspy

# The key in DSPy's settings that holds ``{role slug: dspy.LM}``; DSPy carries it into its worker threads.
CONTEXT_KEY = "chateval_referee_lms"


def referee_lm(slug: str) -> dspy.LM | None:
    """The LM bound to referee ``slug`` in the current context, or None (it runs on the main LM)."""
    bound = dspy.settings.get(CONTEXT_KEY)
    return bound.get(slug) if bound else None


def referee_lms() -> dict[str, dspy.LM]:
    """Every referee LM bound in the current context, by role slug."""
    return dict(dspy.settings.get(CONTEXT_KEY) or {})


def binding(lms: Mapping[str, dspy.LM]) -> contextlib.AbstractContextManager:
    """A context in which each referee of ``lms`` runs on its LM (nothing changes when ``lms`` is empty)."""
    return dspy.context(**{CONTEXT_KEY: dict(lms)}) if lms else contextlib.nullcontext()
