"""People's answers on traced debates, read as an item's labels (no MLflow import: it reads trace objects).

A trace of a judged item (``chateval_dspy.run.tracing``) holds the item's inputs on its root span. People label it
in the MLflow UI (a review queue) or with ``mlflow.log_feedback(trace_id, name=<criterion>, value=...,
source=HUMAN)``; pairwise preferences use the name ``label`` (or ``preference``) with ``1``, ``2`` or ``tie``. How
several answers to one question make one label: docs/production.md ("The rule"); a criterion split evenly is left
unlabelled (the item dropped if nothing is left). Feedback from LLM judges or code is ignored.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field

import dspy

from chateval_dspy.data.loaders import item_from_record
from chateval_dspy.errors import DataError
from chateval_dspy.program.task import TaskSpec
from chateval_dspy.run.tracing import was_cut

log = logging.getLogger(__name__)

PAIRWISE_NAMES = ("label", "preference")
# Sources that name no person: MLflow's Review page on a server without login stores every answer as "default".
ANONYMOUS = ("default", "anonymous")
ITEM_ID_TAG = "chateval.item_id"


def resolve(values: list, ordinal: bool):
    """One value from several reviewers' answers, or None when they split evenly (see the module's rule).

    Example:
        >>> resolve(["pass", "pass", "fail"], ordinal=False), resolve(["pass", "fail"], ordinal=False)
        ('pass', None)
        >>> resolve([4, 5], ordinal=True)
        4.5
    """
    if ordinal:
        return sum(float(v) for v in values) / len(values)
    counts = Counter(str(v).strip() for v in values).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0]


def human_answers(trace) -> dict[str, dict[str, object]]:
    """``{question: {reviewer: value}}`` from a trace's human feedback, each reviewer's latest answer."""
    latest: dict[tuple[str, str], tuple[int, object]] = {}
    for a in trace.info.assessments or []:
        source = getattr(a, "source", None)
        if type(a).__name__ != "Feedback" or source is None or "HUMAN" not in str(source.source_type).upper():
            continue
        if getattr(a, "valid", True) is False or getattr(a, "value", None) is None:
            continue
        key = (a.name, source.source_id or "anonymous")
        when = a.create_time_ms or 0
        if key not in latest or when >= latest[key][0]:
            latest[key] = (when, a.value)
    out: dict[str, dict[str, object]] = {}
    for (name, who), (_, value) in latest.items():
        out.setdefault(name, {})[who] = value
    return out


def label_record(answers: dict[str, dict[str, object]], task) -> tuple[dict, int, int]:
    """The labels of one item from its reviewers' answers: (labels by column, answers counted, disagreements).

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> label_record({"label": {"ann": "2", "bo": "answer_2", "cy": "1"}}, as_task("pairwise"))
        ({'label': '2'}, 3, 0)
    """
    if task.format == "pairwise":
        # "answer_1" (the MLflow judge's spelling) and "1" (a reviewer's) are one vote
        named = {name: str(n) for n, name in enumerate(task.responses, start=1)}
        questions = [("label", [named.get(str(v).strip(), v) for n in PAIRWISE_NAMES for v in answers.get(n, {}).values()],
                      False)]
    else:
        questions = [(c.name, list((answers.get(c.name) or {}).values()), c.scale.ordinal) for c in task.criteria]
    labels, counted, split = {}, 0, 0
    for column, votes, ordinal in questions:
        if votes:
            counted += len(votes)
            value = resolve(votes, ordinal=ordinal)
            split += value is None
            if value is not None:
                labels[column] = value
    return labels, counted, split


@dataclass
class Labelled:
    """One item's labels as its reviewers gave them: the item (None when nothing usable is left) and the count."""

    item: dspy.Example | None
    labels: int = 0  # answers counted (one per reviewer and question)
    disagreements: int = 0
    reviewers: Counter = field(default_factory=Counter)  # answers per reviewer
    problem: str | None = None  # why a trace with answers gave no item


def trace_inputs(trace) -> dict:
    """The judged item's fields as the debate's root span recorded them (``{}`` when unreadable)."""
    try:
        inputs = json.loads(trace.data.request or "{}")
    except (TypeError, ValueError):
        return {}
    return inputs if isinstance(inputs, dict) else {}


def item_id_of(trace) -> str:
    """The judged item's id: its ``chateval.item_id`` tag, else the root span's ``id``, else the trace id."""
    return str(trace.info.tags.get(ITEM_ID_TAG) or trace_inputs(trace).get("id") or trace.info.trace_id)


def relabelled(item: dspy.Example, labels: dict, task) -> dspy.Example:
    """A copy of ``item`` with reviewers' ``labels`` (by column) in place of its own, checked against the task's
    scales; criteria the reviewers left alone keep the item's own label.

    Example:
        >>> x = dspy.Example(id="7", question="q", answer_1="a", answer_2="b", label="1").with_inputs("question")
        >>> relabelled(x, {"label": "tie"}, "pairwise").label
        'tie'
    """
    from chateval_dspy.program.task import as_task

    task = as_task(task)
    fresh = item_from_record({**{n: item[n] for n in task.input_names}, **labels, "id": item.id}, task,
                             source="reviewers' labels")
    if task.format == "pairwise":
        return fresh
    merged = {**(item.get("human") or {}), **{k: v for k, v in (fresh.human or {}).items() if v is not None}}
    return fresh.copy(human=merged)


def labelled(item_id: str, answers: dict[str, dict[str, object]], task, *, inputs: dict | None = None,
             base: dspy.Example | None = None, source: str = "trace", row: int | None = None) -> Labelled:
    """One item with the labels its reviewers' ``answers`` give it, by the module's rule: ``base`` relabelled when
    the item is known (a dataset's, with its full texts), else built from ``inputs`` (what the trace or label file
    recorded of the judged texts)."""
    labels, counted, split = label_record(answers, task)
    who = Counter(w for by in answers.values() for w in by)
    if not labels:
        return Labelled(None, counted, split, who)
    try:
        if base is not None:
            return Labelled(relabelled(base, labels, task), counted, split, who)
        inputs = dict(inputs or {})
        if any(was_cut(v) for v in inputs.values()):
            return Labelled(None, counted, split, who, problem="its texts were cut to fit the trace; name the "
                                                               "dataset they came from so that its full texts are used")
        return Labelled(item_from_record({**inputs, **labels, "id": item_id}, task, source=source, row=row),
                        counted, split, who)
    except DataError as exc:
        return Labelled(None, counted, split, who, problem=str(exc))


@dataclass
class LabelSet:
    """Items labelled by people, and what the card records about where the labels came from."""

    items: dict[str, dspy.Example] = field(default_factory=dict)  # by item id, in the order first labelled
    trace_ids: dict[str, str] = field(default_factory=dict)  # item id -> the trace its stated label came from
    labels: int = 0  # answers counted (one per reviewer and question)
    from_review: int = 0  # of which from MLflow feedback
    disagreements: int = 0  # questions whose reviewers split evenly (left unlabelled)
    unlabelled: int = 0  # traces or ids without usable answers
    overridden: int = 0  # items labelled by an earlier source (or the dataset) whose label a later one replaced
    reviewers: Counter = field(default_factory=Counter)  # answers per reviewer
    sources: list[dict] = field(default_factory=list)  # per source: what it gave

    def add(self, got: Labelled, *, trace_id: str | None = None, review: bool) -> None:
        self.labels += got.labels
        self.from_review += got.labels if review else 0
        self.disagreements += got.disagreements
        self.reviewers.update(got.reviewers)
        if got.item is None:
            self.unlabelled += 1
            return
        item_id = str(got.item.id)
        self.overridden += item_id in self.items
        self.items[item_id] = got.item
        if trace_id:
            self.trace_ids[item_id] = trace_id
        else:
            self.trace_ids.pop(item_id, None)

    def card(self) -> dict:
        """The card's ``labels`` entry: sources, the traces learned from, counts and reviewers."""
        return {"sources": self.sources, "items": len(self.items), "traces": sorted(self.trace_ids.values()),
                "labels": self.labels, "from_review": self.from_review, "from_files": self.labels - self.from_review,
                "disagreements": self.disagreements, "unlabelled": self.unlabelled, "overridden": self.overridden,
                "reviewers": dict(sorted(self.reviewers.items())),
                "anonymous": sum(self.reviewers.get(name, 0) for name in ANONYMOUS)}


def add_traces(out: LabelSet, traces, task: TaskSpec, *, source: str, base: dict | None = None) -> None:
    """Every trace's human feedback into ``out`` (``base``: known items by id); an item traced twice keeps its first
    trace's labels."""
    seen: set[str] = set()
    problems: list[str] = []
    given = len(out.items), out.labels
    for row, trace in enumerate(traces, 1):
        item_id = item_id_of(trace)
        if item_id in seen:  # the same item traced twice (two runs): its first trace's labels stand
            continue
        got = labelled(item_id, human_answers(trace), task, inputs=trace_inputs(trace), base=(base or {}).get(item_id),
                       source=source, row=row)
        if got.problem:
            problems.append(f"trace {trace.info.trace_id}: {got.problem}")
        if got.item is not None:
            seen.add(item_id)
        out.add(got, trace_id=trace.info.trace_id, review=True)
    if problems:  # one line, not one per trace: an experiment can hold thousands of other tasks' traces
        log.warning("%s: %d labelled trace(s) left out, e.g. %s", source, len(problems), problems[0])
    out.sources.append({"source": source, "traces": len(traces), "items": len(out.items) - given[0],
                        "labels": out.labels - given[1]})


def labels_from_traces(traces, task) -> LabelSet:
    """The items people labelled on these traces (what ``ChatEvalJudge.align(traces)`` learns from)."""
    out = LabelSet()
    add_traces(out, list(traces), task, source="traces")
    return out
