"""The verdict rows a batch prediction returns (the registered pyfunc's, ``chateval_dspy.deploy.pyfunc``): the
``verdict`` column first, then ``VERDICT_COLUMNS`` in order. ``RESULT_TYPE`` is the Spark DDL of their struct, for
``mlflow.pyfunc.spark_udf(..., result_type=RESULT_TYPE)``.
"""

from __future__ import annotations

# Name and Spark type of each leading output column; the struct result type names them, in this order.
VERDICT_COLUMNS = (("verdict", "string"), ("id", "string"), ("format", "string"), ("winner", "string"),
                   ("scores", "string"), ("criteria", "string"), ("rationales", "string"), ("abstained", "string"),
                   ("error", "string"), ("prompt_tokens", "long"), ("completion_tokens", "long"),
                   ("seconds", "double"), ("cost_usd", "double"))
RESULT_TYPE = ", ".join(f"{name} {kind}" for name, kind in VERDICT_COLUMNS)
_FILLED = {"prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0}  # an invalid row spent nothing
_DTYPES = {"long": "int64", "double": "float64"}


def verdict_frame(frame):
    """``Judge.evaluate_batch(..., flat=True)``'s frame with the ``verdict`` column first, then ``VERDICT_COLUMNS``
    in order (missing ones null) and the rest as they were. Numbers get fixed dtypes, so that Spark's struct
    conversion never meets a float NaN in a ``long`` field."""
    import pandas as pd

    out = frame.copy()
    for name, kind in VERDICT_COLUMNS[1:]:
        if name not in out:
            out[name] = None
        if name in _FILLED:
            out[name] = out[name].fillna(_FILLED[name]).astype(_DTYPES[kind])
        elif kind == "double":
            out[name] = pd.to_numeric(out[name], errors="coerce").astype("float64")
    pairwise = out["format"] == "pairwise"
    out["verdict"] = out["winner"].where(pairwise, out["scores"]).astype(object)
    out["verdict"] = out["verdict"].where(out["verdict"].notna(), None)
    names = [name for name, _ in VERDICT_COLUMNS]
    return out[names + [c for c in out.columns if c not in names]]
