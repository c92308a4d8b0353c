"""``DataSpec``: which items a run judges (dataset, columns, split, seed, limit), frozen beside ``DebateConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chateval_dspy.data.splits import SPLITS
from chateval_dspy.errors import ConfigError

if TYPE_CHECKING:  # the loaders and task specs are imported when used: a DataSpec is made before any item is read
    import dspy

    from chateval_dspy.data.loaders import Items
    from chateval_dspy.program.task import TaskSpec


@dataclass(frozen=True)
class DataSpec:
    """Where the items come from and which of them a run uses.

    Args:
        dataset: ``faireval``, ``topical_chat``, or a JSONL/CSV file of your own.
        split: ``all``, ``train``, ``dev`` or ``test`` of the seeded 40/20/40 split (``seed``: also the bootstrap's).
        resamples: The bootstrap's resamples per confidence interval (None: ``run.metrics.N_RESAMPLES``); it
            changes no verdict, so ``to_dict`` (and every run key) leaves it out.
        limit: Only the first N items (of the split; of each split for ``parts``).
        task: A custom file's task: a built-in task's name, a task file (YAML/JSON) or a ``TaskSpec``.
        format, columns, skip_bad_rows, label_map, ...: How a custom file is read (``loaders.load_custom``).

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
    task: str | TaskSpec | None = None
    skip_bad_rows: bool = False
    label_map: dict[str, str] = field(default_factory=dict, hash=False)
    group_by: str | None = None
    system: str | None = None
    unlabelled: tuple[str, ...] = ()
    resamples: int | None = None
    label_map_merge: bool = False

    def __post_init__(self) -> None:
        if self.split not in ("all", *SPLITS):
            raise ConfigError(f"unknown split {self.split!r}; choose all, {', '.join(SPLITS)}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be positive, got {self.limit}")
        if self.resamples is not None and (isinstance(self.resamples, bool) or not isinstance(self.resamples, int)
                                           or self.resamples < 1):
            raise ConfigError(f"resamples must be a positive integer, got {self.resamples!r}")

    @property
    def name(self) -> str:
        """The dataset's short name (a file's stem), for results file names."""
        return Path(self.dataset).stem if Path(self.dataset).suffix else self.dataset

    def task_spec(self) -> TaskSpec | None:
        """The items' task: ``task``, a built-in dataset's own, or a format's built-in; None when none is known."""
        from chateval_dspy.data.loaders import BUILTIN
        from chateval_dspy.program.task import builtin_task, load_task

        if self.task is not None:
            return load_task(self.task)
        if self.dataset in BUILTIN:
            return builtin_task(BUILTIN[self.dataset][1])
        return builtin_task(self.format) if self.format else None

    def load(self) -> tuple[Items, str]:
        """Every item of the dataset, and its format (``Items.skipped``: the malformed rows skipped)."""
        from chateval_dspy.data.loaders import load_dataset
        from chateval_dspy.program.task import load_task

        task = load_task(self.task) if self.task is not None else None
        return load_dataset(self.dataset, fmt=self.format, columns=dict(self.columns), task=task,
                            skip_bad_rows=self.skip_bad_rows, label_map=dict(self.label_map), group_by=self.group_by,
                            system=self.system, unlabelled=tuple(self.unlabelled), label_map_merge=self.label_map_merge)

    def _group(self):
        from chateval_dspy.data.splits import grouping

        task = self.task_spec()
        return grouping(task) if task is not None else None

    def items(self) -> tuple[Items, str]:
        """The items of ``split`` (first ``limit``), and the format."""
        from chateval_dspy.data.loaders import Items
        from chateval_dspy.data.splits import select

        items, fmt = self.load()
        return Items(select(items, self.split, seed=self.seed, limit=self.limit, group=self._group()),
                     skipped=items.skipped), fmt

    def parts(self, items: list[dspy.Example]) -> dict[str, list[dspy.Example]]:
        """The seeded train/dev/test split of ``items``, each cut to ``limit`` (for compile and search)."""
        from chateval_dspy.data.splits import split

        return {k: v[: self.limit] if self.limit else v
                for k, v in split(items, seed=self.seed, group=self._group()).items()}

    def to_dict(self) -> dict:
        out = {"dataset": self.dataset, "format": self.format, "columns": dict(self.columns), "split": self.split,
               "seed": self.seed, "limit": self.limit}
        if self.task is not None:  # only when set, so that a built-in run's dict is what it always was
            out["task"] = self.task if isinstance(self.task, str) else self.task.to_dict()
        # Each only when set, as above: a run without them keeps the dict it always had.
        out.update({k: v for k, v in (("skip_bad_rows", self.skip_bad_rows), ("label_map", dict(self.label_map)),
                                      ("group_by", self.group_by), ("system", self.system),
                                      ("unlabelled", list(self.unlabelled)),
                                      ("label_map_merge", self.label_map_merge)) if v})
        return out

    def reading(self) -> dict[str, str]:
        """How a file was read, as the flags that say it, every key always (``-``: not given): MLflow params, so two
        runs that read labels differently differ here, not only in ``dataset_hash``.

        Example:
            >>> DataSpec("my.csv", format="pairwise", columns={"label": "winner"}, label_map={"0": "tie"}).reading()
            ... # doctest: +NORMALIZE_WHITESPACE
            {'columns': 'label=winner', 'label_map': '0=tie', 'label_map_merge': 'false', 'group_by': '-',
             'system': '-', 'unlabelled': '-', 'skip_bad_rows': 'false'}
        """
        def pairs(mapping: dict) -> str:
            return ",".join(f"{k}={v}" for k, v in mapping.items()) or "-"

        return {"columns": pairs(self.columns), "label_map": pairs(self.label_map),
                "label_map_merge": str(self.label_map_merge).lower(), "group_by": self.group_by or "-",
                "system": self.system or "-", "unlabelled": ",".join(self.unlabelled) or "-",
                "skip_bad_rows": str(self.skip_bad_rows).lower()}
