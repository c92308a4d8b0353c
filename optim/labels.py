"""People's labels for a compile: human feedback on traced debates in MLflow, and label files.

``--labels`` names where labels come from, once per source:

- ``mlflow:<experiment>[?filter=<trace filter>]``: human feedback that people attached to traced debates (the
  MLflow UI's Review page, or ``mlflow.log_feedback(trace_id, name=<criterion or "label">, value=...,
  source=HUMAN)``), read by ``chateval_dspy.deploy.feedback``'s rule: each reviewer's latest answer counts
  once, label scales take the majority and integer scales the mean, an even split is a counted disagreement.
- a CSV/JSONL file with an ``id`` column, the labels (``label`` for pairwise, one column per criterion) and
  optionally ``reviewer``; rows may carry the task's inputs too. Several rows for one id are several
  reviewers' answers (the last row of a reviewer counts), resolved by the same rule.

Which label stands when an item is labelled in several places: MLflow feedback over a label file, a label file
over the dataset's own label, and among sources of the same kind the later ``--labels``. An item that a dataset
holds keeps the dataset's texts (a trace may have cut long ones) and takes the reviewers' label.

Where labelled items go (``LabelledData.parts``): they are training labels. With a dataset, each joins the train
split, and a dataset item of the same id leaves dev or test (so no test item is ever learned from); the rest of
the dataset splits as always. Without a dataset, the labelled items themselves split train/dev/test by the seed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import dspy

from chateval_dspy.data.loaders import Items, grouping, read_rows, split
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.deploy.feedback import PAIRWISE_NAMES, LabelSet, add_traces, labelled
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.program.task import TaskSpec, as_task, load_task

log = logging.getLogger(__name__)

PREFIX = "mlflow:"
MAX_TRACES = 10_000
REVIEWER_COLUMN = "reviewer"


def parse_source(source: str) -> tuple[str, str | None]:
    """``mlflow:<experiment>[?filter=<MLflow trace filter>]`` -> (experiment, filter).

    Example:
        >>> parse_source("mlflow:faireval-review?filter=tags.queue = 'q1'")
        ('faireval-review', "tags.queue = 'q1'")
    """
    if not source.startswith(PREFIX):
        raise ConfigError(f"labels source {source!r}: use mlflow:<experiment>[?filter=...] or a CSV/JSONL file")
    parts = urlsplit(source[len(PREFIX):])
    experiment = parts.path.strip()
    if not experiment:
        raise ConfigError(f"labels source {source!r} names no experiment")
    query = parse_qs(parts.query)
    unknown = sorted(set(query) - {"filter"})
    if unknown:
        raise ConfigError(f"labels source {source!r}: unknown option(s) {unknown}; only filter= is known")
    return experiment, (query.get("filter") or [None])[0]


def _task(task) -> TaskSpec:
    if isinstance(task, TaskSpec):
        return task
    if task and str(task).endswith((".yaml", ".yml", ".json")):
        return load_task(task)
    return as_task(task or "pairwise")


def traces_of(source: str, *, tracking_uri: str | None = None) -> list:
    """The traces of ``mlflow:<experiment>[?filter=...]`` (at most ``MAX_TRACES``)."""
    import mlflow

    from optim import tracking

    experiment, filter_string = parse_source(source)
    mlflow.set_tracking_uri(tracking.tracking_uri(tracking_uri))
    found = mlflow.get_experiment_by_name(experiment) or (mlflow.get_experiment(experiment)
                                                           if experiment.isdigit() else None)
    if found is None:
        raise ConfigError(f"{source}: no MLflow experiment named {experiment!r} in {tracking.tracking_uri(tracking_uri)}")
    try:
        return mlflow.search_traces(locations=[found.experiment_id], filter_string=filter_string,
                                    max_results=MAX_TRACES, return_type="list")
    except Exception as exc:  # MLflow raises its own errors for a bad filter
        raise ConfigError(f"{source}: cannot search its traces ({exc})") from exc


def add_file(out: LabelSet, path: str, task: TaskSpec, *, base: dict | None = None) -> None:
    """A label file's rows into ``out``; an id neither the file's row inputs nor the dataset explain is an error."""
    answers: dict[str, dict[str, dict[str, object]]] = {}
    inputs: dict[str, dict] = {}
    first_row: dict[str, int] = {}
    questions = PAIRWISE_NAMES if task.format == "pairwise" else tuple(c.name for c in task.criteria)
    for row, record in read_rows(path):
        if isinstance(record, DataError):
            raise record
        raw = record.get("id")
        if raw in (None, ""):
            raise DataError("a label row needs an id (the item it labels)", source=path, row=row, field="id")
        item_id = str(raw)
        who = str(record.get(REVIEWER_COLUMN) or "file")
        first_row.setdefault(item_id, row)
        inputs.setdefault(item_id, {k: v for k, v in record.items() if k in task.input_names})
        named = [q for q in questions if record.get(q) not in (None, "")]
        if not named:
            raise DataError(f"no label: name one of {', '.join(questions)}", source=path, row=row)
        for q in named:
            answers.setdefault(item_id, {}).setdefault(q, {})[who] = record[q]  # a reviewer's later row wins
    given = len(out.items), out.labels
    for item_id, by in answers.items():
        known = (base or {}).get(item_id)
        if known is None and set(task.input_names) - set(inputs[item_id]):
            raise DataError(f"id {item_id!r} is no item of the dataset, and the row does not carry the task's inputs "
                            f"({', '.join(task.input_names)})", source=path, row=first_row[item_id], field="id")
        got = labelled(item_id, by, task, inputs=inputs[item_id], base=known, source=path, row=first_row[item_id])
        if got.problem:
            raise DataError(got.problem, source=path, row=first_row[item_id])
        out.add(got, review=False)
    out.sources.append({"source": path, "rows": sum(len(v) for by in answers.values() for v in by.values()),
                        "items": len(out.items) - given[0], "labels": out.labels - given[1]})


def read_labels(sources, task=None, *, base: list[dspy.Example] | None = None,
                tracking_uri: str | None = None) -> LabelSet:
    """Every source's labels, by the module's rule (files first, then MLflow; in order within each kind).

    Args:
        sources: ``mlflow:<experiment>[?filter=...]`` and label file paths.
        task: The task the labels belong to (a ``TaskSpec``, a task file or a built-in name; default pairwise).
        base: The dataset's items: labels of their ids relabel them (their full texts are kept).
        tracking_uri: The MLflow tracking store (default: as ``optim.tracking`` resolves it).

    Example:
        >>> got = read_labels(["labels.csv"], "pairwise", base=items)  # doctest: +SKIP
        >>> got.card()["reviewers"]  # doctest: +SKIP
        {'ann': 12, 'bo': 9}
    """
    task = _task(task)
    known = {str(x.id): x for x in base or []}
    out = LabelSet()
    sources = list(sources)
    for source in [s for s in sources if not s.startswith(PREFIX)]:
        if not Path(source).is_file():
            raise ConfigError(f"labels source {source!r}: no such file (and not mlflow:<experiment>)")
        add_file(out, source, task, base=known)
    for source in [s for s in sources if s.startswith(PREFIX)]:
        add_traces(out, traces_of(source, tracking_uri=tracking_uri), task, source=source, base=known)
    return out


def labels_from_mlflow(source: str, task=None, *, tracking_uri: str | None = None) -> LabelSet:
    """The items people labelled in an MLflow experiment of traced debates (``read_labels`` of one source)."""
    parse_source(source)
    return read_labels([source], task, tracking_uri=tracking_uri)


@dataclass(frozen=True)
class LabelledData:
    """A compile's data: a dataset (or none) with people's labels from ``--labels`` sources on top.

    It answers what ``compile_and_save`` asks of a ``DataSpec`` (``load``, ``parts``, ``task_spec``, ...); see the
    module's rules for which label stands and where labelled items go.

    Args:
        labels: The sources (``mlflow:<experiment>[?filter=...]``, label files).
        base: The dataset, or None: the labelled items are the data.
        task: The task without a dataset (default pairwise); with one, the dataset's.
        seed: The split's seed without a dataset (with one, the dataset's).
        limit: Items per split without a dataset (with one, the dataset's; labelled items are never cut).
        tracking_uri: The MLflow store the ``mlflow:`` sources are read from.

    Example:
        >>> data = LabelledData(("mlflow:review",), DataSpec("faireval", limit=8))
        >>> data.dataset
        'faireval+mlflow:review'
    """

    labels: tuple[str, ...]
    base: DataSpec | None = None
    task: str | TaskSpec | None = None
    seed: int = 0
    limit: int | None = None
    tracking_uri: str | None = None
    _read: list = field(default_factory=list, init=False, repr=False, compare=False, hash=False)  # the LabelSet, once

    def __post_init__(self) -> None:
        if not self.labels:
            raise ConfigError("no labels source given")
        if self.base is not None:
            object.__setattr__(self, "seed", self.base.seed)
            object.__setattr__(self, "limit", self.base.limit)

    @property
    def dataset(self) -> str:
        return "+".join(([self.base.dataset] if self.base else []) + list(self.labels))

    @property
    def name(self) -> str:
        return self.base.name if self.base else "labels"

    @property
    def split(self) -> str:
        return "all"

    def task_spec(self) -> TaskSpec:
        if self.base is not None:
            found = self.base.task_spec()
            if found is not None:
                return found
        return _task(self.task)

    def label_set(self) -> LabelSet:
        """The labels, read once (``load`` reads them)."""
        if not self._read:
            self.load()
        return self._read[0]

    def load(self) -> tuple[Items, str]:
        """The dataset's items relabelled where people labelled them, then the labelled items it lacks."""
        base, fmt = self.base.load() if self.base is not None else (Items(), self.task_spec().format)
        got = read_labels(self.labels, self.task_spec(), base=base, tracking_uri=self.tracking_uri)
        if not got.items:
            raise ConfigError(f"no usable label in {', '.join(self.labels)} ({got.unlabelled} traces or ids without "
                              f"one, {got.disagreements} even splits)")
        self._read[:] = [got]
        got.overridden += sum(1 for x in base if str(x.id) in got.items)
        items = [got.items.get(str(x.id), x) for x in base]
        known = {str(x.id) for x in base}
        items += [x for i, x in got.items.items() if i not in known]
        return Items(items, skipped=getattr(base, "skipped", [])), fmt

    def parts(self, items: list[dspy.Example]) -> dict[str, list[dspy.Example]]:
        """Labelled items train; with a dataset, its other items split as always (see the module)."""
        ids = set(self.label_set().items)
        if self.base is None:
            group = grouping(self.task_spec())
            return {k: v[: self.limit] if self.limit else v for k, v in split(items, seed=self.seed, group=group).items()}
        parts = self.base.parts([x for x in items if str(x.id) not in ids])
        parts["train"] = parts["train"] + [x for x in items if str(x.id) in ids]
        return parts

    def to_dict(self) -> dict:
        return {**(self.base.to_dict() if self.base else {"seed": self.seed, "limit": self.limit}),
                "dataset": self.dataset, "labels": list(self.labels)}
