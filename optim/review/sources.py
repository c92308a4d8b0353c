"""What a review ranks: the records of a results file, or of traced debates in an MLflow experiment, each with
the trace a reviewer will read (``chateval_dspy.run.tracing`` tags a trace with its item and run: ``match``).
"""

from __future__ import annotations

import re
from pathlib import Path

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.calibration import unswap_scores
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.run.records import is_error, read_records
from chateval_dspy.run.tracing import debate_span

ITEM_TAG = "chateval.item_id"
RUN_TAG = "chateval.run_key"
MAX_TRACES = 10_000
_PANEL_FIELD = re.compile(r"[a-z][a-z0-9_]*_[12]")


def read_results(path: str | Path) -> list[dict]:
    """The judged records of a results file (error lines left out); a missing or empty file is an error."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"results file {path} does not exist (give a results JSONL of chateval evaluate or score, "
                          "or mlflow:<experiment>)")
    records = [r for r in read_records(path) if not is_error(r)]
    if not records:
        raise ConfigError(f"results file {path} holds no judged item")
    return records


def normalized(record: dict, task: TaskSpec) -> dict:
    """A ``chateval score`` verdict line in the shape of an evaluate results line (``prediction`` and the panel's
    ``<criterion>_<n>`` scores); an evaluate line is returned as it is.

    Example:
        >>> line = {"id": "q1", "format": "pairwise", "winner": "1", "criteria": {"score": {"answer_1": 8.0,
        ...         "answer_2": 3.0}}, "consistent": True}
        >>> got = normalized(line, as_task("pairwise"))
        >>> got["prediction"], got["score_1"], got["score_2"]
        ('1', 8.0, 3.0)
    """
    if "prediction" in record or "winner" not in record:
        return record
    out = dict(record)
    if task.format == "pairwise":
        out["prediction"] = record.get("winner")
        for name, by in (record.get("criteria") or {}).items():
            for n, response in enumerate(task.responses, start=1):
                out[f"{name}_{n}"] = (by or {}).get(response)
    else:
        out["prediction"] = record.get("scores")
    return out


def item_id_of(trace) -> str | None:
    return (trace.info.tags or {}).get(ITEM_TAG)


def _newest_first(traces: list) -> list:
    return sorted(traces, key=lambda t: getattr(t.info, "request_time", 0) or 0, reverse=True)


def match(records: list[dict], traces: list) -> dict[str, str]:
    """``{item id: trace id}`` for the records that have a trace: same item id and (when the record has one; not
    one written before run keys) the same run key; several such traces (the run traced twice): the newest.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> t = lambda tid, item, key, ms: NS(info=NS(trace_id=tid, tags={ITEM_TAG: item, RUN_TAG: key}, request_time=ms))
        >>> match([{"id": 1, "run_key": "k1"}, {"id": 2, "run_key": "k1"}], [t("a", "1", "k1", 1), t("b", "1", "k1", 2),
        ...                                                                 t("c", "2", "k2", 3)])
        {'1': 'b'}
    """
    by_key: dict[tuple[str, str | None], str] = {}
    for trace in _newest_first(traces):
        item = item_id_of(trace)
        if item is None:
            continue
        for key in ((item, (trace.info.tags or {}).get(RUN_TAG)), (item, None)):
            by_key.setdefault(key, trace.info.trace_id)
    out = {}
    for record in records:
        key = (str(record["id"]), str(record["run_key"]) if record.get("run_key") else None)
        if key in by_key:
            out[key[0]] = by_key[key]
    return out


def record_from_trace(trace, task: TaskSpec | str | None = None) -> dict | None:
    """The fields of a results record that an MLflow trace of a debate holds (what the uncertainty score reads), or
    None when the trace is not a chateval debate: the panel's verdict from the root span, each referee's verdicts
    from the order spans (order 2's mapped back on ``task``, default the trace's format's), abstentions from the
    referee turns."""
    root = debate_span(trace)  # the trace's root, or (a trace of an MLflow judge) the span under it
    if root is None:
        return None
    spans = trace.data.spans
    outputs = root.outputs if isinstance(root.outputs, dict) else {}
    attributes = root.attributes or {}
    fmt = attributes.get("chateval.format") or ("pairwise" if "winner" in outputs else "pointwise")
    task = as_task(task or fmt)
    record = {"id": str(attributes.get(ITEM_TAG)), "format": fmt, "abstained": outputs.get("abstained"),
              "trace_id": trace.info.trace_id}
    if (trace.info.tags or {}).get(RUN_TAG):
        record["run_key"] = trace.info.tags[RUN_TAG]
    # A calibrated verdict's confidence, and a verdict withheld for a person, where the trace holds them.
    record.update({k: outputs[k] for k in ("confidence", "confidence_calibrated", "withheld") if k in outputs})
    if task.format == "pairwise":
        record.update(prediction=outputs.get("winner"), consistent=outputs.get("consistent"),
                      order_preferences=outputs.get("order_preferences"),
                      **{k: v for k, v in outputs.items() if _PANEL_FIELD.fullmatch(k)})
    else:
        record["prediction"] = outputs.get("scores")
    orders = sorted((s for s in spans if s.parent_id == root.span_id),
                    key=lambda s: (s.attributes or {}).get("chateval.order", 0))
    referees: dict[str, list] = {}
    for o, span in enumerate(orders):
        swapped = bool((span.attributes or {}).get("chateval.swapped"))
        verdicts = (span.outputs or {}).get("verdicts") if isinstance(span.outputs, dict) else None
        for slug, verdict in (verdicts or {}).items():
            said = unswap_scores(verdict, task) if swapped else verdict  # the swap is its own inverse
            referees.setdefault(slug, [None] * len(orders))[o] = said
    abstentions = {}
    for span in spans:
        out, attrs = span.outputs, span.attributes or {}
        if isinstance(out, dict) and out.get("abstained") and "chateval.role" in attrs:
            key = f"order{attrs.get('chateval.order', 1)}:{attrs['chateval.role']}@{attrs.get('chateval.round')}"
            abstentions[key] = out["abstained"]
    record.update(referees=referees, abstentions=abstentions)
    return record


def search(experiment_id: str, filter_string: str | None = None, *, spans: bool = True) -> list:
    """The experiment's traces (newest first, at most ``MAX_TRACES``), with their tags and assessments."""
    import mlflow

    try:
        traces = mlflow.search_traces(locations=[experiment_id], filter_string=filter_string, max_results=MAX_TRACES,
                                      include_spans=spans, return_type="list")
    except Exception as exc:  # MLflow raises its own errors for a bad filter or an unreachable server
        raise ConfigError(f"experiment {experiment_id}: cannot search its traces ({str(exc)[:300]})") from exc
    return _newest_first(traces)


def debates(traces: list, task=None) -> list[dict]:
    """One record per traced item (its newest trace), read back from the traces (``record_from_trace``)."""
    out: dict[str, dict] = {}
    for trace in _newest_first(traces):
        record = record_from_trace(trace, task)
        if record is not None:
            out.setdefault(record["id"], record)
    return list(out.values())
