"""The one configuration object a run is built from: the CLI, an Optuna trial, MLflow params and a saved judge card
all carry the same ``DebateConfig``, so any run can be rebuilt from what it logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Literal

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, shown

if TYPE_CHECKING:
    from chateval_dspy.program.task import TaskSpec

Format = Literal["pairwise", "pointwise"]
AGGREGATES = ("mean", "majority")


@dataclass(frozen=True)
class DebateConfig:
    """How a panel of referees debates one item.

    Args:
        format: ``pairwise`` or ``pointwise``; default: the task's format, else ``pairwise``.
        roles: Role slugs, one per referee, in speaking order.
        turns: Rounds of talk; the last round is the verdict round.
        calibrate: Pairwise only: judge both answer orders and combine them.
        aggregate: ``mean`` of scores (the paper's default) or ``majority`` vote of preferences.
        parse_retries: Extra attempts when a verdict will not parse, before it becomes an abstention.
        max_text_chars: Longer judged texts are cut to this many characters, with a warning.
        consensus_stop: Every round ends in scores and the debate stops once all referees agree
            (``calls_per_item`` is then the most an item can cost).
        weighted_scores: Use each score's expected value under the LM's log-probabilities (G-Eval style) in
            the mean; the integer score is kept when the LM returns none.
        task: ``task.TaskSpec`` or its dict; None (and a task equal to it): the built-in task of ``format``.

    Example:
        >>> cfg = DebateConfig(format="pairwise", roles=("general_public", "critic"))
        >>> cfg.calls_per_item()
        8
        >>> from chateval_dspy.program.task import builtin_task
        >>> DebateConfig(task=builtin_task("pointwise")).format, cfg.task_spec.name
        ('pointwise', 'faireval')
    """

    format: Format = None  # type: ignore[assignment]  # resolved in __post_init__: the task's, else "pairwise"
    roles: tuple[str, ...] = ("general_public", "critic")
    strategy: str = "one_by_one"
    turns: int = 2
    calibrate: bool = True
    aggregate: str = "mean"
    parse_retries: int = 1
    max_text_chars: int = 6000
    consensus_stop: bool = False
    weighted_scores: bool = False
    role_file: str | None = field(default=None)
    task: TaskSpec | None = None

    def __post_init__(self) -> None:
        from chateval_dspy.program.strategies import STRATEGIES

        # Types first: a config can come from a judge card or MLflow params, where any JSON value may stand.
        self._resolve_task()
        if self.format not in ("pairwise", "pointwise"):
            raise ConfigError(f"unknown format {shown(self.format, 40)}; choose one of: pairwise, pointwise")
        if isinstance(self.roles, str) or not isinstance(self.roles, (tuple, list)):
            raise ConfigError(f"roles must be a list of role slugs, got {shown(self.roles, 80)}")
        if not self.roles:
            raise ConfigError("a debate needs at least one role")
        if len(self.roles) > limits.MAX_ROLES:
            raise ConfigError(f"a debate takes at most {limits.MAX_ROLES} roles (limits.MAX_ROLES), got {len(self.roles)}")
        if not all(isinstance(r, str) for r in self.roles):
            raise ConfigError(f"roles must be role slugs (text), got {shown(list(self.roles), 200)}")
        if len(set(self.roles)) != len(self.roles):
            raise ConfigError(f"roles must be distinct, got {list(self.roles)}")
        if not isinstance(self.strategy, str) or self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {shown(self.strategy, 80)}; choose one of: {', '.join(STRATEGIES)}")
        if not isinstance(self.aggregate, str) or self.aggregate not in AGGREGATES:
            raise ConfigError(f"unknown aggregate {shown(self.aggregate, 80)}; choose one of: {', '.join(AGGREGATES)}")
        for name, low, said, limit in (("turns", 1, "a positive integer", "MAX_TURNS"),
                                       ("parse_retries", 0, ">= 0", "MAX_PARSE_RETRIES"),
                                       ("max_text_chars", limits.MIN_TEXT_CHARS, f"at least {limits.MIN_TEXT_CHARS}",
                                        "MAX_TEXT_CHARS")):
            value, most = getattr(self, name), getattr(limits, limit)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:  # True would pass as 1
                raise ConfigError(f"{name} must be {said}, got {shown(value, 80)}")
            if value > most:
                raise ConfigError(f"{name} must be at most {most} (limits.{limit}), got {value}")
        for name in ("calibrate", "consensus_stop", "weighted_scores"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {shown(getattr(self, name), 80)}")
        if self.role_file is not None and (not isinstance(self.role_file, str)
                                           or len(self.role_file) > limits.MAX_PATH_CHARS):
            raise ConfigError(f"role_file must be a path of at most {limits.MAX_PATH_CHARS} characters "
                              f"(limits.MAX_PATH_CHARS), got {shown(self.role_file, 80)}")
        object.__setattr__(self, "roles", tuple(self.roles))
        spec = self.task_spec
        if self.format == "pairwise" and self.aggregate == "mean" and not spec.preference.combine:
            raise ConfigError(f"aggregate 'mean' compares the responses' mean scores, and task {spec.name!r} has no "
                              "integer-scale criterion to compare: use aggregate 'majority' (the stated preferences)")

    def _resolve_task(self) -> None:
        # Imported here: chateval_dspy.program imports this module (as strategies are, above).
        from chateval_dspy.program.task import TaskSpec, builtin_task

        task, fmt = self.task, self.format
        if isinstance(task, dict):
            task = TaskSpec.from_dict(task, "config key 'task'")
        elif task is not None and not isinstance(task, TaskSpec):
            raise ConfigError(f"task must be a TaskSpec or its dict (task.load_task reads a file), got "
                              f"{type(task).__name__}")
        if fmt is None:
            fmt = task.format if task is not None else "pairwise"
        if task is not None:
            if fmt != task.format:
                raise ConfigError(f"format {shown(fmt, 40)} does not match task {task.name!r}, which is {task.format}")
            if task == builtin_task(fmt):
                task = None  # the built-in itself: configs, run keys and cards stay as they were before tasks
        object.__setattr__(self, "task", task)
        object.__setattr__(self, "format", fmt)

    @property
    def task_spec(self) -> TaskSpec:
        """The task the panel judges: ``task``, or the built-in task of ``format``."""
        from chateval_dspy.program.task import builtin_task

        return self.task if self.task is not None else builtin_task(self.format)

    @property
    def orders(self) -> int:
        """How many answer orders each item is judged in."""
        return 2 if (self.calibrate and self.format == "pairwise") else 1

    def calls_per_item(self) -> int:
        """LM calls one item costs when every call parses on the first try (at most, with ``consensus_stop``)."""
        from chateval_dspy.program.strategies import STRATEGIES

        summaries = (self.turns - 1) if STRATEGIES[self.strategy].summarize else 0
        return self.orders * (len(self.roles) * self.turns + summaries)

    def to_dict(self) -> dict:
        """Plain values for JSON, MLflow params and the judge card (``task`` only when it is not the built-in)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "task"}
        out["roles"] = list(self.roles)
        if self.task is not None:
            out["task"] = self.task.to_dict()
        return out

    def changes(self) -> dict:
        """The fields that differ from the defaults for this format (``format`` always): run keys and study settings
        are built from these, so a field added later with a behaviour-keeping default orphans no results or studies.

        Example:
            >>> DebateConfig(format="pointwise", turns=3).changes()
            {'format': 'pointwise', 'turns': 3}
        """
        defaults = DebateConfig(format=self.format).to_dict()
        return {k: v for k, v in self.to_dict().items() if k == "format" or v != defaults.get(k)}

    @classmethod
    def from_dict(cls, data: dict) -> DebateConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a mapping of field -> value, got {type(data).__name__}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        unknown = sorted(str(k)[:40] for k in set(data) - set(known))
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        return cls(**known)

    def replace(self, **changes) -> DebateConfig:
        return replace(self, **changes)
