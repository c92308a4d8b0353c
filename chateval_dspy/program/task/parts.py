"""The parts a task spec is made of: its input fields, its criteria and a pairwise panel's preference rule."""

from __future__ import annotations

from dataclasses import dataclass

from chateval_dspy.program.task.scale import Scale


@dataclass(frozen=True)
class Criterion:
    """One thing a referee rates: a ``name`` (its output field), a ``description`` it reads, and its ``scale``.

    Example:
        >>> Criterion("faithful", "does every claim follow from the context?", Scale(labels=("pass", "fail"))).scale
        Scale(low=None, high=None, labels=('pass', 'fail'))
    """

    name: str
    description: str
    scale: Scale


@dataclass(frozen=True)
class InputSpec:
    """One input field of an item.

    Args:
        name: The field name (the column it is read from, unless ``--columns`` maps it).
        description: What the text is; the prompt adds that it is data, not instructions.
        judged: A response under judgement: an empty one is data (a warning, and it should lose); an empty
            non-judged input is a malformed row.
        default: The text that stands in when a record has no such field (None: the field is required).
    """

    name: str
    description: str = ""
    judged: bool = False
    default: str | None = None


@dataclass(frozen=True)
class Preference:
    """How a pairwise panel forms its overall preference.

    Args:
        combine: The integer-scale criteria whose mean score per response ``aggregate=mean`` compares (one
            overall criterion, or several combined); empty: every integer-scale criterion.
        stated: When set, each referee also states which response is better (``preference``: 1, 2 or tie;
            this text is the field's description), and ``aggregate=majority`` counts those votes; otherwise a
            referee's vote is what its combined scores imply.
    """

    combine: tuple[str, ...] = ()
    stated: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.combine, (list, str)):
            object.__setattr__(self, "combine", (self.combine,) if isinstance(self.combine, str) else tuple(self.combine))
