"""Reading back stored MLflow traces in tests (shared by test_tracing and test_mlflow_genai)."""

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
