"""A criterion's scale: an integer range (ordinal) or a set of labels (nominal), checked when made.

A scale is what a referee's output field may hold (its ``Literal``) and how a human label read from a file is
understood (``Scale.human``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.program.task.templates import PLACEHOLDER

RANGE = re.compile(r"^\s*(-?\d{1,6})\s*(?:-|\.\.|to)\s*(-?\d{1,6})\s*$")


@dataclass(frozen=True)
class Scale:
    """A criterion's scale: an integer range (``low``..``high``, ordinal) or a set of ``labels`` (nominal).

    Example:
        >>> Scale(1, 5).values, str(Scale(labels=("pass", "fail"))), Scale(0, 1).ordinal
        ((1, 2, 3, 4, 5), 'pass/fail', True)
    """

    low: int | None = None
    high: int | None = None
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.labels:
            if self.low is not None or self.high is not None:
                raise ConfigError("a scale is either an integer range or a list of labels, not both")
            labels = tuple(self.labels)
            if len(labels) < 2 or len(labels) > limits.MAX_SCALE_LABELS:
                raise ConfigError(f"a label scale needs 2 to {limits.MAX_SCALE_LABELS} labels "
                                  f"(limits.MAX_SCALE_LABELS), got {len(labels)}")
            for label in labels:
                if not isinstance(label, str) or not label.strip() or label != label.strip() \
                        or len(label) > limits.MAX_LABEL_CHARS or PLACEHOLDER.search(label):
                    raise ConfigError(f"label {shown(label, 60)} must be a non-empty text of at most "
                                      f"{limits.MAX_LABEL_CHARS} characters (limits.MAX_LABEL_CHARS), no outer spaces")
            if len({lab.casefold() for lab in labels}) != len(labels):
                raise ConfigError(f"labels must be distinct (ignoring case), got {list(labels)}")
            object.__setattr__(self, "labels", labels)
            return
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"an integer scale needs integer bounds, got {name}={shown(value, 40)}")
        if self.low >= self.high:
            raise ConfigError(f"scale {self.low}-{self.high}: the low end must be below the high end")
        if self.high - self.low + 1 > limits.MAX_SCALE_POINTS:
            raise ConfigError(f"scale {self.low}-{self.high} has {self.high - self.low + 1} points; the limit is "
                              f"{limits.MAX_SCALE_POINTS} (limits.MAX_SCALE_POINTS)")

    @property
    def ordinal(self) -> bool:
        """Integer ranges are ordinal (rank correlations apply); labels are classes (accuracy, kappa)."""
        return not self.labels

    @property
    def values(self) -> tuple:
        """Every point of the scale, in order: the ``Literal`` of the output field."""
        return self.labels or tuple(range(self.low, self.high + 1))

    def __str__(self) -> str:
        return "/".join(self.labels) if self.labels else f"{self.low}-{self.high}"

    def accepts(self, value) -> bool:
        """Whether a referee's output ``value`` is a point of the scale (``True`` is not 1, ``7.0`` is not 7)."""
        if self.labels:
            return isinstance(value, str) and value in self.labels
        return type(value) is int and self.low <= value <= self.high

    def human(self, raw) -> float | str | None:
        """A human label as read from a file: a number within the range (means such as 2.67 too), or one of the
        labels (any case); None when missing. Raises ``ValueError`` with the reason when outside the scale.

        Example:
            >>> Scale(1, 5).human("4.5"), Scale(labels=("pass", "fail")).human(" PASS "), Scale(1, 5).human("")
            (4.5, 'pass', None)
        """
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        if self.labels:
            text = str(raw).strip().casefold() if not isinstance(raw, bool) else str(raw).lower()
            for label in self.labels:
                if label.casefold() == text:
                    return label
            raise ValueError(f"expected one of {', '.join(self.labels)}, got {shown(raw, 60)}")
        wanted = f"expected a number in {self.low}..{self.high}, got {shown(raw, 60)}"
        if isinstance(raw, bool):
            raise ValueError(wanted)
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(wanted) from None
        if value != value or not self.low <= value <= self.high:  # NaN fails every comparison
            raise ValueError(wanted)
        return value

    def to_dict(self):
        """``"1-5"`` or a list of labels: the form a task file uses."""
        return list(self.labels) if self.labels else str(self)

    @classmethod
    def from_value(cls, raw) -> Scale:
        """``"1-5"``, ``"1..5"``, ``{"low": 1, "high": 5}``, ``[pass, fail]`` or ``{"labels": [...]}``."""
        if isinstance(raw, str):
            match = RANGE.match(raw)
            if not match:
                raise ConfigError(f"a scale is an integer range such as '1-5' or a list of labels, got {shown(raw, 60)}")
            return cls(int(match.group(1)), int(match.group(2)))
        if isinstance(raw, list):
            if not all(isinstance(x, str) for x in raw):
                raise ConfigError(f"a list scale holds labels (texts); write an integer range as '1-5', got {shown(raw, 80)}")
            return cls(labels=tuple(raw))
        if isinstance(raw, dict) and set(raw) == {"labels"} and isinstance(raw["labels"], list):
            return cls.from_value(raw["labels"])
        if isinstance(raw, dict) and set(raw) == {"low", "high"}:
            return cls(raw["low"], raw["high"])
        raise ConfigError(f"a scale is an integer range such as '1-5' or a list of labels, got {shown(raw, 80)}")
