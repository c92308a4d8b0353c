"""Past one machine: judge a dataset with Ray Data, every worker loading the saved evaluator itself.

Each Ray actor calls ``chateval_dspy.load`` once (JSON state, no pickle) and binds the LM named by
``model``: point it at a shared OpenAI-compatible server (vLLM, llama.cpp) so that the cluster's
workers share one model endpoint. Ray is an optional dependency (``pip install "ray[data]"``).

Example (run on a local Ray cluster in ``tests/test_scale.py``)::

    import ray, pandas as pd
    ds = ray.data.from_pandas(pd.read_json("items.jsonl", lines=True))
    verdicts = judge_dataset(ds, "programs/faireval-bootstrap", model="http://vllm:8000/v1").to_pandas()
"""

from __future__ import annotations


class JudgeBatches:
    """A Ray Data ``map_batches`` callable: load once per actor, then judge pandas batches."""

    def __init__(self, evaluator: str, model: str | None = None, concurrency: int = 2):
        from chateval_dspy.deploy.judge import load

        self.judge = load(evaluator, model=model, slots=concurrency)
        self.concurrency = concurrency

    def __call__(self, batch):
        # Ray's Arrow blocks want flat, consistent columns: nested fields travel as JSON text.
        return self.judge.evaluate_batch(batch, concurrency=self.concurrency, flat=True)


def judge_dataset(dataset, evaluator: str, *, model: str | None = None, actors: int = 1, batch_size: int = 8,
                  concurrency: int = 2):
    """``dataset.map_batches`` over ``actors`` actors, each holding one loaded evaluator."""
    return dataset.map_batches(JudgeBatches, fn_constructor_args=(evaluator, model, concurrency),
                               batch_format="pandas", batch_size=batch_size, concurrency=actors)
