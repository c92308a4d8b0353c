"""Past one machine: judge a dataset with Ray Data, every worker loading the saved evaluator itself.

Each Ray actor calls ``chateval_dspy.load`` once (JSON state, no pickle) and binds the LM named by
``model``: point it at a shared OpenAI-compatible server (vLLM, llama.cpp) so that the cluster's
workers share one model endpoint. Ray is an optional dependency (``pip install "ray[data]"``).

``score_dataset`` writes each verdict by item id into a results directory (``chateval_dspy.deploy.parts``) as it
finishes, and a rerun judges only the items without one; ``judge_dataset`` is the lazy form that keeps nothing.

Example (run on a local Ray cluster in ``tests/test_resumable_scoring.py``)::

    import ray, pandas as pd
    ds = ray.data.from_pandas(pd.read_json("items.jsonl", lines=True))
    report = score_dataset(ds, "programs/faireval-bootstrap", out="/shared/verdicts", model="http://vllm:8000/v1")
"""

from __future__ import annotations

# Ray 2.60 takes these as named ``map_batches`` parameters; any other key of ``ray_remote_args`` goes through
# Ray's ``**ray_remote_args``, which Ray itself deprecates (a RayDeprecationWarning).
NAMED_REMOTE_ARGS = ("num_cpus", "num_gpus", "memory", "label_selector", "fallback_strategy", "max_calls", "resources",
                     "accelerator_type")


class JudgeBatches:
    """A Ray Data ``map_batches`` callable: load once per actor, then judge pandas batches.

    With ``out`` each finished item is appended to this actor's part file and the batch returns its counts
    (one row: scored, errors, skipped); without, the batch returns its verdicts (nested fields as JSON text).
    """

    def __init__(self, evaluator: str, model: str | None = None, concurrency: int = 2, out: str | None = None,
                 done: frozenset = frozenset(), cache_dir: str | None = None, cache: bool = True):
        from chateval_dspy.deploy.judge import load
        from chateval_dspy.deploy.parts import PartWriter, worker_env

        worker_env(cache_dir)
        self.judge = load(evaluator, model=model, slots=concurrency, cache=cache)
        self.concurrency, self.done = concurrency, done
        self.writer = PartWriter(out) if out else None

    def __call__(self, batch):
        if self.writer is None:
            # Ray's Arrow blocks want flat, consistent columns: nested fields travel as JSON text.
            return self.judge.evaluate_batch(batch, concurrency=self.concurrency, flat=True)
        import pandas as pd

        from chateval_dspy.deploy.parts import clean_records, judge_rows

        counts = judge_rows(self.judge, clean_records(batch), self.done, self.writer, concurrency=self.concurrency,
                            source="ray batch")
        return pd.DataFrame([counts])


def _map(dataset, constructor_args: tuple, *, actors: int, batch_size: int, ray_remote_args: dict | None,
         runtime_env: dict | None):
    """``map_batches`` on a fixed pool of ``actors`` actors, with Ray's named remote parameters where it has them."""
    from ray.data import ActorPoolStrategy

    remote = dict(ray_remote_args or {})
    named = {k: remote.pop(k) for k in NAMED_REMOTE_ARGS if k in remote}
    if runtime_env is not None:
        named["runtime_env"] = runtime_env
    return dataset.map_batches(JudgeBatches, fn_constructor_args=constructor_args, batch_format="pandas",
                               batch_size=batch_size, compute=ActorPoolStrategy(size=actors), **named, **remote)


def judge_dataset(dataset, evaluator: str, *, model: str | None = None, actors: int = 1, batch_size: int = 8,
                  concurrency: int = 2, ray_remote_args: dict | None = None, runtime_env: dict | None = None,
                  cache_dir: str | None = None):
    """The lazy dataset of verdicts (nothing kept: see ``score_dataset`` for a resumable run).

    Args:
        dataset: Ray Dataset of items (the task's input fields and ``id``).
        evaluator: A saved evaluator path every worker can read, or an MLflow URI.
        model: The LM spec each worker binds (a base URL, a LiteLLM string); default: the card's model.
        actors: Actors in the pool, each holding one loaded evaluator.
        batch_size: Rows per batch handed to an actor.
        concurrency: Items one actor judges at once.
        ray_remote_args: Per-actor resources (``{"num_cpus": 1}``); Ray's named ``map_batches`` parameters
            (``NAMED_REMOTE_ARGS``) are passed by name, anything else as Ray's deprecated ``**ray_remote_args``.
        runtime_env: Ray's runtime environment for the actors (``{"env_vars": {...}}``).
        cache_dir: Each worker's LM cache directory (set as its ``CHATEVAL_CACHE_DIR`` before loading); None: the
            worker's own ``CHATEVAL_CACHE_DIR`` (inherited, or from ``runtime_env``), else its user's cache.
    """
    from chateval_dspy.deploy.parts import absolute

    return _map(dataset, (evaluator, model, concurrency, None, frozenset(), absolute(cache_dir)), actors=actors,
                batch_size=batch_size, ray_remote_args=ray_remote_args, runtime_env=runtime_env)


def score_dataset(dataset, evaluator: str, *, out: str, model: str | None = None, actors: int = 1,
                  batch_size: int = 8, concurrency: int = 2, ray_remote_args: dict | None = None,
                  runtime_env: dict | None = None, cache_dir: str | None = None, cache: bool = True):
    """Judge ``dataset`` into the results directory ``out``, resuming: items with a verdict there are skipped
    before any LM call. Returns a ``parts.ScaleReport`` (counts of this run); ``parts.read_results(out)`` gives the
    verdicts, one row per id.

    A dataset of one block feeds one actor: give it at least ``actors`` blocks (``from_pandas`` of several frames,
    ``override_num_blocks`` when reading, or ``repartition``). ``out`` is a directory every worker and the driver
    reach at the same path (``chateval_dspy.deploy.parts``:
    a shared filesystem on a cluster; no ``s3://``). The ``id`` column is required and unique: it is collected on
    the driver once and checked before anything is judged. ``cache=False`` turns the workers' LM cache off; the
    other arguments are ``judge_dataset``'s.
    """
    from chateval_dspy.deploy import parts

    where = parts.results_dir(out)
    ids = parts.check_ids(dataset.select_columns(["id"]).to_pandas()["id"], "the Ray dataset")
    with parts.run_lock(where):
        done = parts.prepare(where)
        report = parts.ScaleReport(out=str(where), total=len(ids), skipped=parts.strangers_warning(done, ids, where))
        if report.skipped < report.total:
            args = (evaluator, model, concurrency, str(where), frozenset(done & set(ids)), parts.absolute(cache_dir), cache)
            mapped = _map(dataset, args, actors=actors, batch_size=batch_size, ray_remote_args=ray_remote_args,
                          runtime_env=runtime_env)
            # One small row of counts per batch: summed here, which spares Ray an aggregation stage.
            for counts in mapped.iter_batches(batch_format="pandas", batch_size=None):
                report.scored += int(counts["scored"].sum())
                report.errors += int(counts["errors"].sum())
    return report
