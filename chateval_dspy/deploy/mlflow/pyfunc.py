"""The saved evaluator as an MLflow pyfunc model, logged as code (no pickle) by ``optim.tracking.models``.

Only MLflow runs this file, when it loads the model: the artifact ``evaluator`` is a saved evaluator (or cascade)
directory and the LM comes from ``CHATEVAL_MODEL`` (default: the card's model), so ``mlflow models serve`` and
``mlflow.pyfunc.spark_udf`` judge with the LM of the machine they run on. Rows in and out: ``saved.verdicts``.
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
