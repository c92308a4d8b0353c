"""Judge a Spark DataFrame with a saved evaluator, resumably: ``mapInPandas`` over the partitions, each Python
worker loading the evaluator once (kept while Spark reuses the worker), each finished item appended by id to the
results directory (``parts``). PySpark is optional (and needs a Java runtime); docs/many-machines.md has an example.
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
    """Judge ``df`` (the task's input fields and a unique ``id``) into the results directory ``out``, resuming as
    ``ray.score_dataset`` does, whose arguments these are; ``concurrency`` is per Python worker (Spark's task slots
    multiply it), and ``cache_dir`` None leaves each worker's environment
    (``spark.executorEnv.CHATEVAL_CACHE_DIR`` on a cluster). Returns a ``parts.ScaleReport``."""
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
