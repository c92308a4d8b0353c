"""The saved evaluator as an MLflow pyfunc model, logged as code (no pickle) by ``optim.tracking.models``.

MLflow runs this file when it loads the model: the artifact ``evaluator`` is the saved evaluator
directory (JSON state + card), or a saved cascade's (``deploy.saved.cascade``: each row then goes stage by stage, and its
verdict names its ``stage``), and the LM comes from ``CHATEVAL_MODEL`` (default: the card's model; a cascade's: each
stage's), so ``mlflow models serve`` and ``mlflow.pyfunc.spark_udf`` judge with the LM of the
machine they run on. Input: a DataFrame with the task's input fields (and ``id``, optionally), which the model's
signature declares in the task's order, so that Spark's positional columns are named; a frame without them is
refused, not judged into abstentions. Output: one verdict row per item, ``verdict`` first
(``chateval_dspy.deploy.saved.verdicts``). Only MLflow runs this file: nothing imports it.
"""

from __future__ import annotations

import os

import mlflow
from mlflow.pyfunc import PythonModel


class ChatEvalPyfunc(PythonModel):
    def load_context(self, context):
        from chateval_dspy.deploy.saved.judge import load
        from chateval_dspy.lm.spec import LMSpec

        self.judge = load(context.artifacts["evaluator"], lm=LMSpec(model=os.environ.get("CHATEVAL_MODEL") or None))

    def predict(self, context, model_input, params=None):
        import pandas as pd

        from chateval_dspy.deploy.saved.verdicts import model_records, verdict_frame

        concurrency = int((params or {}).get("concurrency", 2))
        records = model_records(pd.DataFrame(model_input), self.judge.task)
        return verdict_frame(self.judge.evaluate_batch(records, concurrency=concurrency, flat=True))


mlflow.models.set_model(ChatEvalPyfunc())
