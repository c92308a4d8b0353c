"""The seeded split every step reuses: its parts, in order, their shares of the items, and the split itself.

Importing this module imports no DSPy (``DataSpec`` and the ``chateval`` parser name the parts through it).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from typing import TYPE_CHECKING

from chateval_dspy.errors import DataError

if TYPE_CHECKING:
    import dspy

    from chateval_dspy.program.task import TaskSpec

SPLITS = ("train", "dev", "test")
SPLIT_FRACTIONS = (0.4, 0.2, 0.4)


def split_record(seed: int, limit: int | None, parts: dict) -> dict:
    """The split as a saved evaluator's card records it: seed, shares, item limit and each part's size.

    Example:
        >>> split_record(0, 5, {"train": [1, 2], "dev": [3], "test": [4, 5]})
        {'seed': 0, 'fractions': [0.4, 0.2, 0.4], 'limit': 5, 'sizes': {'train': 2, 'dev': 1, 'test': 2}}
    """
    return {"seed": seed, "fractions": list(SPLIT_FRACTIONS), "limit": limit, "sizes": {k: len(v) for k, v in parts.items()}}


def dataset_hash(items) -> str:
    """A stable hash of the items a run saw (their ids, inputs and labels)."""
    h = hashlib.sha256()
    for x in items:
        h.update(json.dumps(x.toDict(), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _group(item: dspy.Example) -> str:
    # Topical-Chat's six responses to one context stay in one split, so no context leaks from train to test.
    return item.get("dialogue_history") or item.id


def grouping(task: TaskSpec | str):
    """How ``split`` keeps items together: pointwise by their first unjudged input (the context several responses
    answer), pairwise one by one.

    Example:
        >>> import dspy
        >>> grouping("pointwise")(dspy.Example(id="7", dialogue_history="h", response="r"))
        'h'
    """
    from chateval_dspy.program.task import as_task

    task = as_task(task)
    context = next((i.name for i in task.inputs if not i.judged), None)
    if task.format == "pairwise" or context is None:
        return lambda item: item.id
    return lambda item: item.get(context) or item.id


def split(items: list[dspy.Example], *, seed: int = 0, fractions=SPLIT_FRACTIONS,
          group=None) -> dict[str, list[dspy.Example]]:
    """Seeded train/dev/test split, stratified by label; items of one ``group`` (default: the dialogue history)
    land in the same part. The same seed and items always give the same split.

    Example:
        >>> from chateval_dspy.data.loaders import load_faireval
        >>> parts = split(load_faireval(), seed=0)
        >>> [len(parts[s]) for s in SPLITS]
        [32, 16, 32]
    """
    if abs(sum(fractions) - 1) > 1e-9 or len(fractions) != 3:
        raise ValueError("fractions must be three numbers summing to 1")
    strata: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for item in items:
        stratum = str(item.get("label")) if "label" in item else "all"
        strata[stratum][(group or _group)(item)].append(item)
    rng = random.Random(seed)
    out = {s: [] for s in SPLITS}
    for stratum in sorted(strata):
        groups = sorted(strata[stratum])
        rng.shuffle(groups)
        n = len(groups)
        n_train = round(n * fractions[0])
        n_dev = round(n * (fractions[0] + fractions[1])) - n_train
        bounds = {"train": groups[:n_train], "dev": groups[n_train:n_train + n_dev], "test": groups[n_train + n_dev:]}
        for name, keys in bounds.items():
            out[name] += [item for key in keys for item in strata[stratum][key]]
    order = {id(x): i for i, x in enumerate(items)}
    return {s: sorted(v, key=lambda x: order[id(x)]) for s, v in out.items()}


def select(items: list[dspy.Example], part: str = "all", *, seed: int = 0, limit: int | None = None,
           group=None) -> list[dspy.Example]:
    """One split (or ``all``), then the first ``limit`` items."""
    if part != "all":
        if part not in SPLITS:
            raise DataError(f"unknown split {part!r}; choose all, {', '.join(SPLITS)}")
        items = split(items, seed=seed, group=group)[part]
    return items[:limit] if limit else items
