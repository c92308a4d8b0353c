"""``DataSpec``: which items a run judges (dataset, columns, split, seed, limit), frozen beside ``DebateConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field

import dspy

from chateval_dspy.data.loaders import SPLITS, load_dataset, select, split
from chateval_dspy.errors import ConfigError


@dataclass(frozen=True)
class DataSpec:
    """Where the items come from and which of them a run uses.

    Args:
        dataset: ``faireval``, ``topical_chat``, or a JSONL/CSV file of your own.
        format: The format of a custom file (``pairwise`` or ``scoring``).
        columns: Our field name -> your column name, for a custom file.
        split: ``all``, ``train``, ``dev`` or ``test`` of the seeded 40/20/40 split.
        seed: The split's (and the bootstrap's) seed.
        limit: Only the first N items (of the split; of each split for ``parts``).

    Example:
        >>> items, fmt = DataSpec("faireval", split="test", limit=3).items()
        >>> fmt, len(items)
        ('pairwise', 3)
    """

    dataset: str
    format: str | None = None
    columns: dict[str, str] = field(default_factory=dict, hash=False)
    split: str = "all"
    seed: int = 0
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.split not in ("all", *SPLITS):
            raise ConfigError(f"unknown split {self.split!r}; choose all, {', '.join(SPLITS)}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be positive, got {self.limit}")

    @property
    def name(self) -> str:
        """The dataset's short name (a file's stem), for results file names."""
        from pathlib import Path

        return Path(self.dataset).stem if Path(self.dataset).suffix else self.dataset

    def load(self) -> tuple[list[dspy.Example], str]:
        """Every item of the dataset, and its format."""
        return load_dataset(self.dataset, fmt=self.format, columns=dict(self.columns))

    def items(self) -> tuple[list[dspy.Example], str]:
        """The items of ``split`` (first ``limit``), and the format."""
        items, fmt = self.load()
        return select(items, self.split, seed=self.seed, limit=self.limit), fmt

    def parts(self, items: list[dspy.Example]) -> dict[str, list[dspy.Example]]:
        """The seeded train/dev/test split of ``items``, each cut to ``limit`` (for compile and search)."""
        return {k: v[: self.limit] if self.limit else v for k, v in split(items, seed=self.seed).items()}

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "format": self.format, "columns": dict(self.columns), "split": self.split,
                "seed": self.seed, "limit": self.limit}
