"""A span tree sent to MLflow as one trace, with explicit span times, every text scrubbed of secrets (``scrub``).

MLflow writes traces from a background queue: the spans are made in the caller's thread (a few milliseconds per
item, BENCHMARKS.md), the writing happens in MLflow's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from chateval_dspy.run.tracing.spans import debate_tree
from chateval_dspy.scrub import scrub, secret_values


def emit(tree: dict, *, tags: Mapping[str, str] | None = None, metadata: Mapping[str, str] | None = None,
         experiment_id: str | None = None, parent=None) -> str | None:
    """Create the spans of ``tree`` in MLflow (the active experiment unless ``experiment_id``), every text
    scrubbed of secrets; returns the trace id. ``parent``: a live span to hang the tree under (then it is
    part of that span's trace). ``metadata``: trace metadata of a new trace (MLflow's own keys too)."""
    import mlflow

    secrets = secret_values()
    clean = (lambda v: scrub(v, secrets)) if secrets else (lambda v: v)

    def build(node, parent_span, **extra):
        span = mlflow.start_span_no_context(clean(node["name"]), span_type=node["span_type"], parent_span=parent_span,
                                            inputs=clean(node["inputs"]), attributes=clean(node["attributes"]),
                                            start_time_ns=node["start_ns"], **extra)
        try:
            for child in node["children"]:
                build(child, span)
        finally:  # a span left open would keep its whole trace in memory, unexported
            if node["error"]:
                span.set_status("ERROR")
            span.end(outputs=clean(node["outputs"]), end_time_ns=node["end_ns"])
        return span

    tags = clean({k: str(v) for k, v in (tags or {}).items()})
    new = {"tags": tags, "metadata": clean(dict(metadata)) if metadata else None, "experiment_id": experiment_id}
    root = build(tree, parent, **({} if parent is not None else new))
    if parent is not None and tags and parent is mlflow.get_current_active_span():
        mlflow.update_current_trace(tags=tags)  # the enclosing trace (a scorer's) is this item's trace
    return root.trace_id


def trace_record(record: dict, inputs: Mapping[str, str] | None = None, *, config=None, roles=None,
                 model: str | None = None, tags: Mapping[str, str] | None = None,
                 metadata: Mapping[str, str] | None = None, experiment_id: str | None = None,
                 ended_ns: int | None = None, parent=None) -> str | None:
    """One judged item as one MLflow trace (``debate_tree`` sent to MLflow); returns the trace id.

    Tags: ``chateval.item_id``, ``chateval.task``, and when known ``chateval.run_key`` and ``chateval.model``,
    plus ``tags``. Exceptions propagate (``Tracer`` is the forgiving wrapper that batches use).
    """
    tree = debate_tree(record, inputs, config=config, roles=roles, ended_ns=ended_ns)
    all_tags = {"chateval.item_id": str(record.get("id")),
                "chateval.task": (config.task_spec.name if config is not None else str(record.get("format")))}
    if record.get("run_key"):
        all_tags["chateval.run_key"] = str(record["run_key"])
    if model:
        all_tags["chateval.model"] = model
        tree["attributes"]["chateval.model"] = model
    all_tags.update(tags or {})
    return emit(tree, tags=all_tags, metadata=metadata, experiment_id=experiment_id, parent=parent)


def dumps(value) -> str:
    """Compact JSON for metadata and tags (MLflow keeps them as text).

    Example:
        >>> dumps({"critic": [{"score_1": 8}]})
        '{"critic":[{"score_1":8}]}'
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
