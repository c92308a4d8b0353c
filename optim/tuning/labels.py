"""People's labels for a compile (``--labels``): human feedback on traced debates in MLflow, and label files.

A source is ``mlflow:<experiment>[?filter=<trace filter>]`` or a CSV/JSONL file (``id``, ``label`` or one column per
criterion, optionally ``reviewer`` and the task's inputs; a reviewer's last row counts); answers are resolved by
``chateval_dspy.deploy.mlflow.trace_labels``'s rule (docs/production.md). MLflow feedback wins over a label file, a
file over the dataset's own label, and the later ``--labels`` among sources of one kind; a dataset item keeps its
texts (a trace may have cut long ones). Labelled items train (``LabelledData.parts``): with a dataset, one of the
same id leaves dev and test, so no test item is ever learned from; without one, they split by the seed.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import dspy

from chateval_dspy import limits
from chateval_dspy.data.loaders import Items
from chateval_dspy.data.rows import read_rows
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.data.splits import grouping, split
from chateval_dspy.deploy.mlflow.trace_labels import PAIRWISE_NAMES, LabelSet, add_traces, human_answers, labelled
from chateval_dspy.deploy.saved.card_md import UNPRINTABLE
from chateval_dspy.errors import ConfigError, DataError, shown
from chateval_dspy.program.task import TaskSpec, as_task, load_task

log = logging.getLogger(__name__)

PREFIX = "mlflow:"
MAX_TRACES = 10_000
REVIEWER_COLUMN = "reviewer"


def unprintable(text: str) -> str | None:
    """The first character of ``text`` that would act rather than show (``card_md.UNPRINTABLE``: a control, a line
    break, a bidi override).

    Example:
        >>> unprintable("Zoë <ann@example.org>") is None, unprintable("ann\\n- model: evil")
        (True, '\\n')
    """
    found = UNPRINTABLE.search(text)
    return found.group() if found else None


def check_name(value, *, source: str, row: int | None, field: str) -> str:
    """A reviewer's name or an item's id as text, at most ``limits.MAX_LABEL_NAME_CHARS`` characters that all show
    (cards print reviewers' names: a newline would forge a line of the card, an ESC drive a terminal).

    Example:
        >>> check_name("ann@example.org", source="l.csv", row=2, field="reviewer")
        'ann@example.org'
        >>> check_name("ann\\x1b[2J", source="l.csv", row=2, field="reviewer")
        Traceback (most recent call last):
        chateval_dspy.errors.DataError: l.csv row 2: field 'reviewer': ... holds the control character '\\x1b'...
    """
    if isinstance(value, int) and not isinstance(value, bool):  # a JSONL file's numeric ids and reviewer ids
        value = str(value)
    if not isinstance(value, str):
        raise DataError(f"must be a text, got {type(value).__name__}", source=source, row=row, field=field)
    if len(value) > limits.MAX_LABEL_NAME_CHARS:
        raise DataError(f"{shown(value, 60)} is {len(value)} characters long; the limit is "
                        f"{limits.MAX_LABEL_NAME_CHARS} (limits.MAX_LABEL_NAME_CHARS)", source=source, row=row,
                        field=field)
    if (bad := unprintable(value)) is not None:
        raise DataError(f"{shown(value, 60)} holds the control character {bad!r}; names and ids are one line of "
                        "printable text", source=source, row=row, field=field)
    return value


def check_label(value, *, source: str, row: int | None, field: str) -> None:
    """A label cell: a number, or a short one-line text (a scale's label is at most ``limits.MAX_LABEL_CHARS``)."""
    if isinstance(value, (int, float)):
        return
    if not isinstance(value, str) or len(value.strip()) > limits.MAX_LABEL_CHARS or unprintable(value.strip()):
        raise DataError(f"{shown(value, 60)} is no label: a number or a one-line text of at most "
                        f"{limits.MAX_LABEL_CHARS} characters (limits.MAX_LABEL_CHARS)", source=source, row=row,
                        field=field)


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
    """A ``TaskSpec``, a task file or a format name (default pairwise) as a ``TaskSpec``."""
    file = not isinstance(task, TaskSpec) and str(task or "").endswith((".yaml", ".yml", ".json"))
    return load_task(task) if file else as_task(task or "pairwise")


def traces_of(source: str, *, tracking_uri: str | None = None) -> list:
    """The traces of ``mlflow:<experiment>[?filter=...]`` (at most ``MAX_TRACES``)."""
    import mlflow

    from optim.tracking import runs as tracking

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


def label_rows(path: str) -> list[tuple[int, dict]]:
    """A label file's ``(row, record)`` pairs; whatever Python's CSV reader still refuses (``read_rows`` bounds
    cells itself) is a ``DataError`` naming the file, never a bare ``csv.Error``."""
    try:
        return read_rows(path)
    except csv.Error as exc:
        raise DataError(f"cannot read it as CSV ({shown(str(exc), 80)})", source=path) from exc


def _answers_of(record: dict, row: int, path: str, questions: tuple[str, ...]) -> tuple[str, str, dict]:
    """One label row checked: (item id, reviewer, {question: value})."""
    raw = record.get("id")
    if raw in (None, ""):
        raise DataError("a label row needs an id (the item it labels)", source=path, row=row, field="id")
    item_id = check_name(raw, source=path, row=row, field="id")
    given = record.get(REVIEWER_COLUMN)
    who = "file" if given in (None, "") else check_name(given, source=path, row=row, field=REVIEWER_COLUMN)
    named = {q: record[q] for q in questions if record.get(q) not in (None, "")}
    if not named:
        raise DataError(f"no label: name one of {', '.join(questions)}", source=path, row=row)
    for q, value in named.items():
        check_label(value, source=path, row=row, field=q)
    return item_id, who, named


def add_file(out: LabelSet, path: str, task: TaskSpec, *, base: dict | None = None) -> None:
    """A label file's rows into ``out``; an id neither the file's row inputs nor the dataset explain is an error."""
    answers: dict[str, dict[str, dict[str, object]]] = {}
    inputs: dict[str, dict] = {}
    first_row: dict[str, int] = {}
    questions = PAIRWISE_NAMES if task.format == "pairwise" else tuple(c.name for c in task.criteria)
    for row, record in label_rows(path):
        item_id, who, named = _answers_of(record, row, path, questions)
        first_row.setdefault(item_id, row)
        inputs.setdefault(item_id, {k: v for k, v in record.items() if k in task.input_names})
        for q, value in named.items():
            answers.setdefault(item_id, {}).setdefault(q, {})[who] = value  # a reviewer's later row wins
    given = len(out.items), out.labels
    for item_id, by in answers.items():
        known = (base or {}).get(item_id)
        if known is None and set(task.input_names) - set(inputs[item_id]):
            raise DataError(f"id {shown(item_id, 60)} is no item of the dataset, and the row does not carry the "
                            f"task's inputs ({', '.join(task.input_names)})", source=path, row=first_row[item_id],
                            field="id")
        got = labelled(item_id, by, task, inputs=inputs[item_id], base=known, source=path, row=first_row[item_id])
        if got.problem:
            raise DataError(got.problem, source=path, row=first_row[item_id])
        out.add(got, review=False)
    out.sources.append({"source": path, "rows": sum(len(v) for by in answers.values() for v in by.values()),
                        "items": len(out.items) - given[0], "labels": out.labels - given[1]})


def read_labels(sources, task=None, *, base: list[dspy.Example] | None = None,
                tracking_uri: str | None = None) -> LabelSet:
    """Every source's labels (``mlflow:...`` and label files), by the module's rule (files first, then MLflow; in
    order within each kind). ``task``: a ``TaskSpec``, a task file or a built-in name (default pairwise); ``base``:
    the dataset's items, relabelled where their ids are labelled (their full texts kept).
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
        traces = traces_of(source, tracking_uri=tracking_uri)
        for row, trace in enumerate(traces, 1):  # reviewers' names, checked as a label file's are
            for who in [name for by in human_answers(trace).values() for name in by]:
                check_name(who, source=f"{source} trace {shown(trace.info.trace_id, 80)}", row=row, field=REVIEWER_COLUMN)
        add_traces(out, traces, task, source=source, base=known)
    anonymous = out.card()["anonymous"]
    if anonymous:  # counted, but flagged: such answers cannot be told apart, so several people count as one
        log.warning("%d answer(s) name no reviewer (MLflow's 'default' source: its Review page on a server without "
                    "login); they count as one reviewer. Answer on `chateval review serve`, which stores each "
                    "reviewer's own name", anonymous)
    return out


def labels_from_mlflow(source: str, task=None, *, tracking_uri: str | None = None) -> LabelSet:
    """The items people labelled in an MLflow experiment of traced debates (``read_labels`` of one source)."""
    parse_source(source)
    return read_labels([source], task, tracking_uri=tracking_uri)


@dataclass(frozen=True)
class LabelledData:
    """A compile's data: a dataset (``base``, or None: the labelled items are the data) with people's labels from
    ``--labels`` sources on top. It answers what ``compile_and_save`` asks of a ``DataSpec``; see the module for
    which label stands and where labelled items go. With a dataset, its task, seed and limit stand (labelled items
    are never cut).

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
    split = "all"  # not a field: labelled data is always split by the compile itself

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
    def resamples(self) -> int | None:
        """The bootstrap's resamples behind each CI: the dataset's (None: ``metrics.N_RESAMPLES``)."""
        return self.base.resamples if self.base is not None else None

    def task_spec(self) -> TaskSpec:
        return (self.base is not None and self.base.task_spec()) or _task(self.task)

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

    def reading(self) -> dict[str, str]:
        """How the dataset's labels were read (``DataSpec.reading``), and the label sources on top."""
        return {**(self.base.reading() if self.base else {}), "labels": ",".join(self.labels)}

    def to_dict(self) -> dict:
        return {**(self.base.to_dict() if self.base else {"seed": self.seed, "limit": self.limit}),
                "dataset": self.dataset, "labels": list(self.labels)}
