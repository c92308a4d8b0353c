"""The rows a batch prediction takes (``model_records``) and returns (``verdict_frame``; ``RESULT_TYPE`` is their
Spark struct, for ``mlflow.pyfunc.spark_udf``), and ``LoadedJudge.evaluate_batch`` between them (a ``Judge``'s or
a ``CascadeJudge``'s).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, TypeVar

from chateval_dspy.concurrency import bounded_unordered
from chateval_dspy.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

# Name and Spark type of each leading output column; the struct result type names them, in this order.
VERDICT_COLUMNS = (("verdict", "string"), ("id", "string"), ("format", "string"), ("winner", "string"),
                   ("scores", "string"), ("criteria", "string"), ("rationales", "string"), ("abstained", "string"),
                   ("error", "string"), ("prompt_tokens", "long"), ("completion_tokens", "long"),
                   ("seconds", "double"), ("cost_usd", "double"), ("confidence", "string"))
RESULT_TYPE = ", ".join(f"{name} {kind}" for name, kind in VERDICT_COLUMNS)
_FILLED = {"prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0}  # an invalid row spent nothing
# A verdict's fields that hold lists or objects: JSON text in a flat frame, for Arrow-based engines.
NESTED_COLUMNS = ("scores", "rationales", "referees", "truncated", "criteria", "empty", "usage_by_model", "confidence",
                  "raw_confidence", "withheld", "stages_run")


def model_records(frame, task) -> list[dict]:
    """The rows of a prediction's input frame as item records for ``Judge.evaluate_batch`` (missing values None).

    Raises:
        DataError: a required input of ``task`` is no column of the frame (every row would abstain, so the batch is
            refused), saying how to name Spark's positional columns (``0``, ``1``, ...) when they came unnamed.
    """
    columns = [str(c) for c in frame.columns]
    missing = [i.name for i in task.inputs if i.default is None and i.name not in columns]
    if missing:
        unnamed = [c for c in columns if c.isdigit()]
        why = (f"the columns came unnamed ({', '.join(unnamed)}), so none can be matched to a field: pass them by "
               "name (spark_udf: udf(struct(*df.columns))), or in the signature's order "
               f"({', '.join(task.input_names)}, then optionally id)") if unnamed else \
            f"got column(s) {', '.join(map(repr, columns)) or 'none'}"
        raise DataError(f"task {task.name!r} needs column(s) {', '.join(map(repr, missing))}: {why}",
                        source="model input")
    frame = frame.astype(object)
    return frame.where(frame.notna(), None).rename(columns=str).to_dict("records")


def verdict_frame(frame):
    """``Judge.evaluate_batch(..., flat=True)``'s frame with ``VERDICT_COLUMNS`` first, in order (missing ones null).
    Numbers get fixed dtypes, so that Spark's struct conversion never meets a float NaN in a ``long`` field."""
    import pandas as pd

    out = frame.copy()
    for name, kind in VERDICT_COLUMNS[1:]:
        if name not in out:
            out[name] = None
        if name in _FILLED:
            out[name] = out[name].fillna(_FILLED[name]).astype({"long": "int64", "double": "float64"}[kind])
        elif kind == "double":
            out[name] = pd.to_numeric(out[name], errors="coerce").astype("float64")
    pairwise = out["format"] == "pairwise"
    out["verdict"] = out["winner"].where(pairwise, out["scores"]).astype(object)
    out["verdict"] = out["verdict"].where(out["verdict"].notna(), None)
    names = [name for name, _ in VERDICT_COLUMNS]
    return out[names + [c for c in out.columns if c not in names]]


_Loaded = TypeVar("_Loaded", bound="LoadedJudge")


class LoadedJudge:
    """What a loaded ``Judge`` and ``CascadeJudge`` share: batches (``evaluate_batch``), and closing its LMs (its
    ``_stack``) as a context manager, or by ``close()``."""

    _stack: contextlib.ExitStack

    def evaluate_batch(self, items, *, concurrency: int = 4, flat: bool = False) -> pd.DataFrame:
        """Judge many items (a DataFrame or records), at most ``concurrency`` in flight, into a DataFrame in input
        order: an invalid row gets its error in ``error`` and the batch goes on; ``flat``: ``NESTED_COLUMNS`` as JSON
        text, for Arrow-based engines (Ray, Spark, MLflow serving)."""
        import pandas as pd

        records = items.to_dict("records") if isinstance(items, pd.DataFrame) else list(items)

        def one(indexed):
            i, record = indexed
            try:
                return {**self(record, row=i + 1, source="batch").to_dict(), "error": None}
            except DataError as exc:
                return {"id": str(record.get("id", i + 1)) if isinstance(record, dict) else str(i + 1), "error": str(exc)}

        out = [None] * len(records)
        for (i, _), verdict in bounded_unordered(one, list(enumerate(records)), concurrency):
            out[i] = verdict
        frame = pd.DataFrame(out)
        if flat:
            for column in NESTED_COLUMNS:
                if column in frame:
                    frame[column] = frame[column].map(lambda v: None if v is None else json.dumps(v, default=str))
        return frame

    def close(self) -> None:
        self._stack.close()

    def __enter__(self: _Loaded) -> _Loaded:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
