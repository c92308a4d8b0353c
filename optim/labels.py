"""Human labels from MLflow: feedback people attached to traced debates becomes the items a compile learns from.

A trace of a judged item (``chateval_dspy.run.tracing``) holds the item's inputs on its root span. People label it
in the MLflow UI (a review queue) or with ``mlflow.log_feedback(trace_id, name=<criterion>, value=...,
source=HUMAN)``; pairwise preferences use the name ``label`` (or ``preference``) with ``1``, ``2`` or ``tie``.

Rule for several answers to one question on one trace: each reviewer's latest answer counts once; label scales
(and pairwise preferences) take the majority, integer scales the mean (as the benchmarks' human scores are means).
A label question whose reviewers split evenly is a *disagreement*: it is counted, and that criterion is left
unlabelled on the item (the item is dropped if nothing is left). Feedback from LLM judges or code is ignored.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import dspy

from chateval_dspy.data.loaders import item_from_record
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.program.task import TaskSpec, as_task, load_task

log = logging.getLogger(__name__)

PREFIX = "mlflow:"
PAIRWISE_NAMES = ("label", "preference")
MAX_TRACES = 10_000


@dataclass
class LabelSet:
    """Items labelled by people, and what the card records about where the labels came from."""

    items: list[dspy.Example] = field(default_factory=list)
    trace_ids: list[str] = field(default_factory=list)
    labels: int = 0  # answers counted (one per reviewer and question)
    disagreements: int = 0  # questions whose reviewers split evenly (left unlabelled)
    unlabelled: int = 0  # traces without usable human feedback
    reviewers: Counter = field(default_factory=Counter)

    def card(self, source: str) -> dict:
        return {"source": source, "traces": list(self.trace_ids), "items": len(self.items), "labels": self.labels,
                "disagreements": self.disagreements, "unlabelled_traces": self.unlabelled,
                "reviewers": dict(self.reviewers)}


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
    counts = Counter(str(v) for v in values).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0]


def _human_answers(trace) -> dict[str, dict[str, object]]:
    """``{question: {reviewer: value}}`` from a trace's human feedback, each reviewer's latest answer."""
    latest: dict[tuple[str, str], tuple[int, object]] = {}
    for a in trace.info.assessments or []:
        source = getattr(a, "source", None)
        if type(a).__name__ != "Feedback" or source is None or str(source.source_type).upper().find("HUMAN") < 0:
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


def label_record(inputs: dict, answers: dict[str, dict[str, object]], task) -> tuple[dict, int, int]:
    """The labels of one item from its reviewers' answers: (labels by column, answers counted, disagreements)."""
    labels, counted, split = {}, 0, 0
    if task.format == "pairwise":
        questions = {n: answers[n] for n in PAIRWISE_NAMES if n in answers}
        votes = [v for by in questions.values() for v in by.values()]
        if votes:
            counted += len(votes)
            value = resolve(votes, ordinal=False)
            split += value is None
            if value is not None:
                labels["label"] = value
        return labels, counted, split
    for criterion in task.criteria:
        by = answers.get(criterion.name)
        if not by:
            continue
        counted += len(by)
        value = resolve(list(by.values()), ordinal=criterion.scale.ordinal)
        if value is None:
            split += 1
        else:
            labels[criterion.name] = value
    return labels, counted, split


def labels_from_mlflow(source: str, task=None, *, tracking_uri: str | None = None) -> LabelSet:
    """The items people labelled in an MLflow experiment of traced debates.

    Args:
        source: ``mlflow:<experiment name or id>[?filter=<trace filter>]``.
        task: The task spec (name, file or TaskSpec; default the pairwise built-in) the labels belong to.
        tracking_uri: The MLflow tracking store (default: as ``optim.tracking`` resolves it).
    """
    import mlflow

    from optim import tracking

    task = task if isinstance(task, TaskSpec) else load_task(task) if task and str(task).endswith(
        (".yaml", ".yml", ".json")) else as_task(task or "pairwise")
    experiment, filter_string = parse_source(source)
    mlflow.set_tracking_uri(tracking.tracking_uri(tracking_uri))
    found = mlflow.get_experiment_by_name(experiment) or (mlflow.get_experiment(experiment)
                                                           if experiment.isdigit() else None)
    if found is None:
        raise ConfigError(f"{source}: no MLflow experiment named {experiment!r} in {tracking.tracking_uri(tracking_uri)}")
    try:
        traces = mlflow.search_traces(locations=[found.experiment_id], filter_string=filter_string,
                                      max_results=MAX_TRACES, return_type="list")
    except Exception as exc:  # MLflow raises its own errors for a bad filter
        raise ConfigError(f"{source}: cannot search its traces ({exc})") from exc
    out = LabelSet()
    seen: set[str] = set()
    for trace in traces:
        answers = _human_answers(trace)
        try:
            inputs = json.loads(trace.data.request or "{}")
        except ValueError:
            inputs = {}
        if not isinstance(inputs, dict):
            inputs = {}
        labels, counted, split = label_record(inputs, answers, task)
        out.labels += counted
        out.disagreements += split
        if not labels:
            out.unlabelled += 1
            continue
        item_id = str(trace.info.tags.get("chateval.item_id") or inputs.get("id") or trace.info.trace_id)
        if item_id in seen:  # the same item traced twice (two runs): its first trace's labels stand
            continue
        try:
            item = item_from_record({**inputs, **labels, "id": item_id}, task, source=source,
                                    row=len(out.trace_ids) + 1)
        except DataError as exc:
            log.warning("trace %s: %s; left out", trace.info.trace_id, exc)
            out.unlabelled += 1
            continue
        seen.add(item_id)
        out.items.append(item)
        out.trace_ids.append(trace.info.trace_id)
        for by in answers.values():
            out.reviewers.update(by.keys())
    return out


def combine(file_items: list[dspy.Example], reviewed: list[dspy.Example]) -> tuple[list[dspy.Example], int]:
    """File labels and reviewers' labels together: a reviewer's label overrides the file's for the same item id.

    Returns the items and how many file items the reviewers overrode.
    """
    by_id = {str(x.id): x for x in reviewed}
    merged = [by_id.pop(str(x.id), x) for x in file_items]
    overridden = len(file_items) - sum(1 for x in merged if x in file_items)
    return merged + list(by_id.values()), overridden
