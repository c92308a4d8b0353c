"""Judge a Spark DataFrame with a saved evaluator, resumably: ``mapInPandas`` over the partitions, each Python
worker loading the evaluator once (kept for the next partition while Spark reuses the worker), each finished item
appended by id to the results directory (``chateval_dspy.deploy.scale.parts``), so a rerun judges only what is missing.

PySpark is optional (``pip install pyspark`` and a Java runtime); it is imported only here, inside the function.

Example (run on ``local[2]`` in ``tests/test_resumable_scoring.py``)::

    df = spark.read.json("items.jsonl")
    report = score_spark(df, "programs/faireval-bootstrap", out="/shared/verdicts", model="http://vllm:8000/v1")
"""

from __future__ import annotations

import threading

_judges: dict[tuple, object] = {}  # (evaluator, model, slots, cache_dir, cache) -> a loaded Judge, per worker
_judges_lock = threading.Lock()


def _judge(evaluator: str, model: str | None, concurrency: int, cache_dir: str | None, cache: bool):
    """This worker's loaded evaluator for these settings (loaded on first use)."""
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.deploy.scale.parts import worker_env
    from chateval_dspy.lm.spec import LMSpec

    key = (evaluator, model, concurrency, cache_dir, cache)
    with _judges_lock:
        if key not in _judges:
            worker_env(cache_dir)
            _judges[key] = load(evaluator, lm=LMSpec(model=model, cache=cache), slots=concurrency)
        return _judges[key]


def _partition_scorer(evaluator: str, model: str | None, out: str, done: frozenset, concurrency: int,
                      cache_dir: str | None, cache: bool, identity, max_in_flight: int | None):
    """The ``mapInPandas`` function: judge a partition's batches into a part file; one row of counts per batch."""

    def score(batches):
        import pandas as pd

        from chateval_dspy.deploy.scale.parts import PartWriter, clean_records, judge_rows, stamp

        judge = _judge(evaluator, model, concurrency, cache_dir, cache)
        writer = PartWriter(out, stamp(judge, identity, out))
        try:
            for batch in batches:
                counts = judge_rows(judge, clean_records(batch), done, writer, concurrency=concurrency,
                                    source="spark partition", max_in_flight=max_in_flight)
                yield pd.DataFrame([counts])
        finally:
            writer.close()

    return score


def score_spark(df, evaluator: str, *, out: str, model: str | None = None, concurrency: int = 2,
                cache_dir: str | None = None, cache: bool = True, max_in_flight: int | None = None):
    """Judge ``df`` into the results directory ``out``, resuming: ids with a verdict there are skipped before any
    LM call. Returns a ``parts.ScaleReport``; ``parts.read_results(out)`` gives the verdicts, one row per id.

    Args:
        df: A Spark DataFrame of items (the task's input fields and a unique ``id`` column, collected on the driver
            once and checked before anything is judged).
        evaluator: A saved evaluator path every executor can read, or an MLflow URI.
        out: The results directory: local, or on a cluster a filesystem every executor and the driver mount at the
            same path (``chateval_dspy.deploy.scale.parts``; no ``s3://``).
        model: The LM spec each worker binds (a base URL, a LiteLLM string); default: the card's model.
        concurrency: Items one Python worker judges at once (Spark's task slots multiply it). Each item makes its
            calls in parallel (both answer orders of a calibrated pairwise panel, every referee of a round).
        cache_dir: Each worker's LM cache directory (set as its ``CHATEVAL_CACHE_DIR`` before loading); None: the
            worker's environment (``spark.executorEnv.CHATEVAL_CACHE_DIR`` on a cluster), else its user's cache.
        cache: False turns the workers' LM cache off.
        max_in_flight: LM calls one task keeps in flight at most (``concurrency.call_slots``); None: up to
            ``concurrency`` x an item's parallel calls.

    ``out`` is locked first, then the ids are collected and checked, and the directory is read: a line of another
    evaluator or run there is refused (``chateval_dspy.deploy.scale.parts``).
    """
    from chateval_dspy.concurrency import check_slots
    from chateval_dspy.deploy.scale import parts

    check_slots(max_in_flight)
    where = parts.results_dir(out)
    with parts.run_lock(where):
        ids = parts.check_ids([row[0] for row in df.select("id").collect()], "the Spark DataFrame")
        identity, done, report = parts.begin(where, evaluator, ids)
        if report.skipped < report.total:
            scorer = _partition_scorer(evaluator, model, str(where), done, concurrency, parts.absolute(cache_dir),
                                       cache, identity, max_in_flight)
            # One small row of counts per Arrow batch: collected and summed here, with no shuffle.
            counts = df.mapInPandas(scorer, schema="scored long, errors long, skipped long").collect()
            report.scored, report.errors = sum(c.scored for c in counts), sum(c.errors for c in counts)
        else:
            parts.check_finished(where, evaluator, model, identity, cache)
    return report
