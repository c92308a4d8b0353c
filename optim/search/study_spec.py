"""``StudySpec``: which study a search runs and how, and the study's default name and storage. Plain data, without
Optuna, so that ``chateval search --help`` and ``chateval report --help`` state the defaults the study opens with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chateval_dspy.errors import ConfigError
from optim.search.space import parse_objectives

DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"


@dataclass(frozen=True)
class StudySpec:
    """Which study a search runs and how: run until the study holds ``trials`` finished (complete or pruned) trials;
    ``objectives``: one of ``optim.search.space.OBJECTIVE_SETS`` (``cascade_cost`` needs ``run_search``'s
    ``cascade``); ``prune`` stops trials that cannot beat the median after a chunk of ``report_every`` dev items (one
    objective only).

    Example:
        >>> StudySpec("faireval-agreement", trials=20).objectives
        ('agreement',)
    """

    name: str
    trials: int
    storage: str = DEFAULT_STORAGE
    objectives: tuple[str, ...] = ("agreement",)
    prune: bool = True
    report_every: int = 4

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a study needs a name")
        if self.trials < 1:
            raise ConfigError(f"--trials must be positive, got {self.trials}")
        if self.report_every < 1:
            raise ConfigError(f"--report-every must be positive, got {self.report_every}")
        object.__setattr__(self, "objectives", parse_objectives(self.objectives))


def default_study_name(dataset: str, objectives: Sequence[str]) -> str:
    stem = Path(dataset).stem if Path(dataset).suffix else dataset
    return f"{stem}-{'-'.join(objectives)}"
