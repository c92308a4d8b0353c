"""MLflow traces in tests: reading stored ones back (shared by test_tracing and test_mlflow_genai), and a traced
item with human feedback on it (test_labels, test_label_integrity)."""

from __future__ import annotations


def span_tree(trace) -> list:
    """The stored trace's span names as ``[name, [children]]``, children by answer order, then in start order (the
    two orders run at once, so either may start first)."""
    spans = sorted(trace.data.spans, key=lambda s: ((s.attributes or {}).get("chateval.order") or 0, s.start_time_ns,
                                                    s.name))
    kids: dict = {}
    for s in spans:
        kids.setdefault(s.parent_id, []).append(s)

    def walk(s):
        return [s.name, [walk(c) for c in kids[s.span_id]]] if s.span_id in kids else s.name

    return [walk(s) for s in kids[None]]


def traced(mlflow, item_id: str, inputs: dict) -> str:
    with mlflow.start_span("chateval", span_type="EVALUATOR") as span:
        span.set_inputs({"id": item_id, **inputs})
        span.set_outputs({"winner": "1"})
    client = mlflow.MlflowClient()
    client.set_trace_tag(span.trace_id, "chateval.item_id", item_id)
    return span.trace_id


def feedback(mlflow, trace_id: str, name: str, value, who: str) -> None:
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    mlflow.log_feedback(trace_id=trace_id, name=name, value=value,
                        source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=who))
