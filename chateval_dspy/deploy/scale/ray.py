"""Past one machine: judge a dataset with Ray Data (optional), each actor loading the saved evaluator once and
binding the LM named by ``model`` (a shared OpenAI-compatible server, say). ``score_dataset`` writes each verdict by
id into a results directory (``parts``), and a rerun judges only the items without one; ``judge_dataset`` is the lazy
form that keeps nothing. Both check the cluster's resources first (``check_resources``). docs/many-machines.md has
an example.
"""

from __future__ import annotations

# Ray 2.60 takes these as named ``map_batches`` parameters; any other key of ``ray_remote_args`` goes through
# Ray's ``**ray_remote_args``, which Ray itself deprecates (a RayDeprecationWarning).
NAMED_REMOTE_ARGS = ("num_cpus", "num_gpus", "memory", "label_selector", "fallback_strategy", "max_calls", "resources",
                     "accelerator_type")


class JudgeBatches:
    """A Ray Data ``map_batches`` callable: load once per actor, then judge pandas batches into this actor's part
    file in ``out`` (returning one row of counts), or without ``out`` into verdicts."""

    def __init__(self, evaluator: str, model: str | None, concurrency: int, out: str | None, done: frozenset,
                 cache_dir: str | None, cache: bool, identity, max_in_flight: int | None):
        from chateval_dspy.deploy.saved.judge import load
        from chateval_dspy.deploy.scale.parts import worker_env
        from chateval_dspy.lm.spec import LMSpec

        worker_env(cache_dir)
        self.judge = load(evaluator, lm=LMSpec(model=model, cache=cache), slots=max_in_flight or concurrency)
        self.concurrency, self.done, self.max_in_flight = concurrency, done, max_in_flight
        self.out, self.identity, self.writer = out, identity, None

    def __call__(self, batch):
        from chateval_dspy.concurrency import call_slots

        if self.out is None:
            # Ray's Arrow blocks want flat, consistent columns: nested fields travel as JSON text.
            with call_slots(self.max_in_flight):
                return self.judge.evaluate_batch(batch, concurrency=self.concurrency, flat=True)
        import pandas as pd

        from chateval_dspy.deploy.scale.parts import PartWriter, clean_records, judge_rows, stamp

        if self.writer is None:  # checked in a task, not the constructor: a task's error ends the job with its message
            self.writer = PartWriter(self.out, stamp(self.judge, self.identity, self.out))
        counts = judge_rows(self.judge, clean_records(batch), self.done, self.writer, concurrency=self.concurrency,
                            source="ray batch", max_in_flight=self.max_in_flight)
        return pd.DataFrame([counts])


def check_resources(actors: int, ray_remote_args: dict | None, dataset=None) -> None:
    """A ``ConfigError`` saying what to change when the cluster (started locally if none is) cannot hold ``actors``
    actors of ``ray_remote_args``, plus one CPU for the tasks that feed them unless ``dataset`` is materialized: Ray
    would wait for those resources forever, with no error."""
    import ray
    from ray.data.dataset import MaterializedDataset

    from chateval_dspy.errors import ConfigError

    if not isinstance(actors, int) or isinstance(actors, bool) or actors < 1:
        raise ConfigError(f"actors: must be a whole number of 1 or more, got {actors!r}")
    if not ray.is_initialized():
        ray.init()  # what Ray Data would do on the first batch; done here to see what there is
    have = ray.cluster_resources()
    remote = dict(ray_remote_args or {})
    fed = dataset is not None and isinstance(dataset, MaterializedDataset)
    wanted = {"CPU": remote.get("num_cpus", 1), "GPU": remote.get("num_gpus", 0), "memory": remote.get("memory", 0),
              **(remote.get("resources") or {})}
    for name, each in wanted.items():
        spare = 1 if name == "CPU" and not fed else 0
        need = actors * (each or 0) + spare
        if need > have.get(name, 0):
            per = {"CPU": "num_cpus", "GPU": "num_gpus"}.get(name, name)
            feeding = " + 1 CPU for the Ray Data tasks that feed them (reading, repartitioning)" if spare else ""
            raise ConfigError(
                f"the Ray cluster has {have.get(name, 0):g} {name} and this job needs {need:g}: {actors} actor(s) x "
                f"{each or 0:g} {name} each (ray_remote_args {per!r}){feeding}. Use fewer actors, a smaller {per!r} "
                "per actor (a fraction such as 0.5 is allowed), or a larger cluster (ray.init(num_cpus=...) on one "
                "machine)")


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
                  cache_dir: str | None = None, max_in_flight: int | None = None):
    """The lazy dataset of verdicts (nothing kept), judged as ``score_dataset`` judges."""
    from chateval_dspy.concurrency import check_slots
    from chateval_dspy.deploy.scale.parts import absolute

    check_slots(max_in_flight)
    check_resources(actors, ray_remote_args, dataset)
    return _map(dataset, (evaluator, model, concurrency, None, frozenset(), absolute(cache_dir), True, None,
                          max_in_flight),
                actors=actors, batch_size=batch_size, ray_remote_args=ray_remote_args, runtime_env=runtime_env)


def score_dataset(dataset, evaluator: str, *, out: str, model: str | None = None, actors: int = 1,
                  batch_size: int = 8, concurrency: int = 2, ray_remote_args: dict | None = None,
                  runtime_env: dict | None = None, cache_dir: str | None = None, cache: bool = True,
                  max_in_flight: int | None = None):
    """Judge ``dataset`` (the task's input fields and a unique ``id``) into the results directory ``out``, resuming:
    items with a verdict there are skipped before any LM call. Returns a ``parts.ScaleReport`` of this run;
    ``parts.read_results(out)`` gives the verdicts. ``out`` is locked first, then the cluster's resources, the ids
    and the directory are checked (``parts``' rules).

    Args:
        evaluator: A saved evaluator path every worker can read, or an MLflow URI.
        out: A directory every worker and the driver reach at the same path (no ``s3://``).
        model: The LM spec each worker binds (a base URL, a LiteLLM string); default: the card's model.
        actors: Actors in the pool, each holding one loaded evaluator; a dataset of one block feeds one actor.
        concurrency: Items one actor judges at once, each making its calls in parallel (both answer orders,
            every referee of a round), so up to ``concurrency x orders x referees`` LM calls in flight unless
            ``max_in_flight`` bounds them (``concurrency.call_slots``).
        ray_remote_args: Per-actor resources (``{"num_cpus": 1}``); those not in ``NAMED_REMOTE_ARGS`` go as Ray's
            deprecated ``**ray_remote_args``.
        cache_dir: Each worker's LM cache directory (its ``CHATEVAL_CACHE_DIR``); None: the worker's own.
    """
    from chateval_dspy.concurrency import check_slots
    from chateval_dspy.deploy.scale import parts

    check_slots(max_in_flight)
    where = parts.results_dir(out)
    with parts.run_lock(where):
        check_resources(actors, ray_remote_args, dataset)
        ids = parts.check_ids(dataset.select_columns(["id"]).to_pandas()["id"], "the Ray dataset")
        identity, done, report = parts.begin(where, evaluator, ids)
        if report.skipped < report.total:
            args = (evaluator, model, concurrency, str(where), done, parts.absolute(cache_dir), cache, identity,
                    max_in_flight)
            mapped = _map(dataset, args, actors=actors, batch_size=batch_size, ray_remote_args=ray_remote_args,
                          runtime_env=runtime_env)
            # One small row of counts per batch: summed here, which spares Ray an aggregation stage.
            for counts in mapped.iter_batches(batch_format="pandas", batch_size=None):
                report.scored += int(counts["scored"].sum())
                report.errors += int(counts["errors"].sum())
        else:
            parts.check_finished(where, evaluator, model, identity, cache)
    return report
