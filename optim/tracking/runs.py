"""MLflow runs, metrics, params and artifacts (the models are ``optim.tracking.models``'s).

The store (``tracking_uri``) may be a local SQLite file, ``postgresql://...``, or an ``http://`` tracking server
shared by workers on many hosts. Params are the run's ``DebateConfig`` plus model, data and split: no secret has a
way in, and ``assert_no_secrets`` double-checks every text before it is logged (traces, built by
``chateval_dspy.run.tracing``, scrub the same secrets from every span). How a run ends, SIGKILL included: ``run``.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from chateval_dspy.errors import SecretError
from chateval_dspy.run.metrics import Estimate
from chateval_dspy.scrub import secret_values

DEFAULT_DIR = "mlruns"
EXPERIMENT = "chateval-dspy"
WORKER_TAG = "chateval.worker"


@dataclass(frozen=True)
class TrackingSpec:
    """Whether and where a compile or search is logged to MLflow."""

    enabled: bool = True  # the CLI's --no-mlflow turns it off
    uri: str | None = None  # default: as ``tracking_uri`` resolves it
    log_model: bool = True  # the saved program as MLflow models (the pyfunc and the dspy flavour)
    register: str | None = None  # the pyfunc model's registered name
    wheelhouse: bool = False  # the wheels of the pyfunc model's environment go in it (``models.log_pyfunc_model``)


def tracking_uri(uri: str | None = None) -> str:
    """The URI in force: the argument, ``MLFLOW_TRACKING_URI``, or the local sqlite store under ``mlruns/``."""
    if uri:
        return uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    Path(DEFAULT_DIR).mkdir(exist_ok=True)
    return f"sqlite:///{Path(DEFAULT_DIR).resolve() / 'mlflow.db'}"


# Stores this process has opened once already: MLflow created their tables then, and keeps the store.
_OPENED: set[str] = set()


def setup(uri: str | None = None) -> str:
    """Point MLflow at the store and experiment; returns the experiment's id. A database store is first opened
    under ``optim.tracking.stores.init_lock``: workers that start together on a fresh one would each create it."""
    import mlflow

    from optim.tracking import stores

    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    with contextlib.nullcontext() if uri in _OPENED else stores.init_lock(uri, "mlflow"):
        experiment = mlflow.set_experiment(EXPERIMENT)  # with the sqlite store, artifacts: ./mlruns/<experiment>/<run>
    _OPENED.add(uri)
    return experiment.experiment_id


def assert_no_secrets(text: str, where: str) -> None:
    """Refuse (``SecretError``) a text holding a credential: a key or token from the environment, the key
    file's key, or a registered token (``chateval_dspy.scrub.secret_values``, which traces use too)."""
    for secret in secret_values():
        if secret in text:
            raise SecretError(f"refusing to log {where}: it contains the value of a credential variable "
                              "(a key or token from the environment); nothing was logged")


def tracking_targeted(uri: str | None = None) -> bool:
    """Whether the user pointed this command at MLflow (``--tracking-uri`` or ``MLFLOW_TRACKING_URI``): then
    commands that log nothing else (score) trace by default, within the tracing rule."""
    return bool(uri or os.environ.get("MLFLOW_TRACKING_URI"))


def start_tracing(uri: str | None = None) -> str:
    """Point MLflow at the store and experiment that traces go to; returns the experiment id."""
    return setup(uri)


def tracer_for(flag: bool | None, *, items: list, config, uri: str | None = None, mlflow_target: bool = True,
               tags: dict | None = None):
    """A ``Tracer`` for a batch when the tracing rule says so (``chateval_dspy.run.tracing.tracing_default``:
    ``flag`` is ``--trace``/``--no-trace`` or None, ``mlflow_target`` whether the run logs to MLflow), pointed at
    the tracking store; else None. ``config``: the panel, or a function of the format that returns it."""
    from chateval_dspy.run.tracing import Tracer, tracing_default

    if not tracing_default(flag, mlflow_target=mlflow_target, items=len(items)):
        return None
    return Tracer(config, items=items, tags=tags, experiment_id=start_tracing(uri))


def _flat(params: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return out


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a run was open. A KeyboardInterrupt, so that a scheduler's stop ends the command as
    Ctrl-C does: the run ends KILLED, finished results are kept, and the CLI exits with 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run_status(exc: BaseException | None) -> str:
    """How a run ends, by what left its block.

    Example:
        >>> run_status(None), run_status(ValueError()), run_status(KeyboardInterrupt()), run_status(Terminated(15))
        ('FINISHED', 'FAILED', 'KILLED', 'KILLED')
        >>> run_status(SystemExit(0)), run_status(SystemExit(2))
        ('FINISHED', 'FAILED')
    """
    if exc is None or (isinstance(exc, SystemExit) and not exc.code):
        return "FINISHED"
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside the block, SIGTERM raises ``Terminated`` in the main thread instead of ending the process on the spot.

    Without it, a scheduler's or ``kill``'s SIGTERM would end the process before the run could be ended, leaving it
    RUNNING. A second SIGTERM ends the process at once, as usual. Nothing changes off the main thread (signals
    are only delivered there) or where the caller set a SIGTERM handler of its own; the default is back afterwards.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        signal.signal(signum, signal.SIG_DFL)
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


URL_SWITCH = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


@contextlib.contextmanager
def no_run_links() -> Iterator[None]:
    """Inside the block, MLflow does not print its "View run ... at" / "View experiment at" lines: it prints them
    as every run ends, child runs too, burying the command's own output (which prints its run id once). MLflow
    reads the switch as a run ends, so it is set only while runs are open; a setting of the user's own is kept.
    """
    if URL_SWITCH in os.environ:
        yield
        return
    os.environ[URL_SWITCH] = "true"
    try:
        yield
    finally:
        os.environ.pop(URL_SWITCH, None)


@contextlib.contextmanager
def run(name: str, *, params: dict, tags: dict | None = None, nested: bool = False, uri: str | None = None,
        run_id: str | None = None) -> Iterator:
    """An MLflow run holding ``params`` (flattened) and ``tags``; nested under the active run if asked.

    The run is RUNNING while the block runs (from before any item is judged) and ends by how the block ends
    (``run_status``): FINISHED, FAILED (an exception), KILLED (Ctrl-C, or SIGTERM, which a run that is not nested
    turns into ``Terminated`` while it is open). ``run_id`` resumes that run instead of starting one. A new run is
    tagged with this worker (``WORKER_TAG``: host, pid, process start time), so a rerun can end it as KILLED should
    this process be killed by a signal that cannot be caught (``end_dead_runs``).
    """
    import mlflow

    from optim.search.worker import Worker

    if not nested:
        setup(uri)
    tags = {**(tags or {}), **({} if run_id else {WORKER_TAG: Worker.current().tag()})}
    assert_no_secrets(repr(tags), "tags")
    with no_run_links(), (contextlib.nullcontext() if nested else sigterm_interrupts()):
        active = mlflow.start_run(run_id=run_id, run_name=None if run_id else name, nested=nested,
                                  tags=None if run_id else tags)
        try:
            log_params(params)
            yield active
        except BaseException as exc:
            _end_active(active.info.run_id, run_status(exc))
            raise
        _end_active(active.info.run_id, "FINISHED")


def _end_active(run_id: str, status: str) -> None:
    import mlflow

    current = mlflow.active_run()
    if current is not None and current.info.run_id == run_id:
        mlflow.end_run(status)
    else:  # a run nested in it was left open (cut short inside MLflow's own code): the store still gets its end
        mlflow.MlflowClient().set_terminated(run_id, status)


def set_tags(tags: dict) -> None:
    """Tag the active run (what is known only as it ends: batch ids, an unpriced model)."""
    import mlflow

    if tags:
        assert_no_secrets(repr(tags), "tags")
        mlflow.set_tags(tags)


def create_run(name: str, *, tags: dict, uri: str | None = None) -> str:
    """A run created but not entered (a candidate that a caller may still delete); returns its id."""
    import mlflow

    experiment_id = setup(uri)
    assert_no_secrets(repr(tags), "tags")
    return mlflow.MlflowClient().create_run(experiment_id, run_name=name, tags=tags).info.run_id


def delete_run(run_id: str) -> None:
    import mlflow

    mlflow.MlflowClient().delete_run(run_id)


def run_exists(run_id: str, uri: str | None = None) -> bool:
    """Whether ``run_id`` is a live (not deleted) run of this store."""
    import mlflow

    setup(uri)
    try:
        return mlflow.MlflowClient().get_run(run_id).info.lifecycle_stage == "active"
    except mlflow.exceptions.MlflowException:
        return False


def end_run(run_id: str, status: str = "KILLED", uri: str | None = None) -> None:
    """End ``run_id`` (and its RUNNING child runs) with ``status``, if it is still RUNNING."""
    import mlflow

    setup(uri)
    client = mlflow.MlflowClient()
    try:
        run = client.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return
    _end_tree(client, run_id, status, _running(client, run.info.experiment_id))


def _running(client, experiment_id: str) -> dict:
    """``{run id: run}`` of the experiment's RUNNING runs."""
    runs = client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=5000)
    return {r.info.run_id: r for r in runs}


def _end_tree(client, run_id: str, status: str, running: dict) -> list[str]:
    ended = []
    if run_id in running:
        client.set_terminated(run_id, status)
        ended.append(run_id)
    # Optimizer autologging nests a child run per evaluation: a killed compile leaves those RUNNING too.
    for child, r in running.items():
        if r.data.tags.get("mlflow.parentRunId") == run_id and child not in ended:
            ended += _end_tree(client, child, status, running)
    return ended


def end_dead_runs(scope: dict[str, str], uri: str | None = None) -> list[str]:
    """End as KILLED every RUNNING run whose tags include ``scope`` (``{"chateval.out": ...}``, ``{"optuna.study":
    ...}``) and whose worker has certainly died (same host, the process gone); the ids ended, children included."""
    import mlflow

    from optim.search.worker import dead

    experiment_id = setup(uri)
    client = mlflow.MlflowClient()
    running = _running(client, experiment_id)
    ended: list[str] = []
    for run_id, r in list(running.items()):
        tags = r.data.tags
        if all(tags.get(k) == v for k, v in scope.items()) and WORKER_TAG in tags and dead(tags[WORKER_TAG]) \
                and run_id not in ended:
            ended += _end_tree(client, run_id, "KILLED", running)
    return ended


def metric_values(metrics: dict, cost: dict | None = None, prefix: str = "") -> dict[str, float]:
    """Estimates become value, CI bounds and ``_n`` (what the figure rests on: items, or a summary-level figure's
    documents where it is defined); NaN figures are left out (MLflow stores no NaN meaningfully).

    Example:
        >>> metric_values({"q_spearman_summary": Estimate(0.5, 0.2, 0.7, 3), "n_groups": 4})
        ... # doctest: +NORMALIZE_WHITESPACE
        {'q_spearman_summary': 0.5, 'q_spearman_summary_ci_low': 0.2, 'q_spearman_summary_ci_high': 0.7,
         'q_spearman_summary_n': 3.0, 'n_groups': 4.0}
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Estimate):
            d = value.to_dict()
            out.update({f"{prefix}{key}": d["value"], f"{prefix}{key}_ci_low": d["ci_low"],
                        f"{prefix}{key}_ci_high": d["ci_high"], f"{prefix}{key}_n": float(d["n"])})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    for key, value in (cost or {}).items():
        if isinstance(value, (int, float)):
            out[f"{prefix}{key}"] = float(value)
    return {k: v for k, v in out.items() if not math.isnan(v)}


def log_params(params: dict) -> None:
    """Log ``params`` (flattened) to the active run; those it holds already with the same value are skipped.

    Workers that share a study's parent run log the same params into it, and MLflow refuses a param written twice
    at the same moment: the one that loses finds the values there and goes on (another value is still an error).
    """
    import mlflow

    flat = _flat(params)
    assert_no_secrets(repr(flat), "params")

    def missing() -> dict[str, str]:
        active = mlflow.active_run()
        held = mlflow.MlflowClient().get_run(active.info.run_id).data.params if active else {}
        return {k: v for k, v in flat.items() if held.get(k) != v}

    flat = missing()
    if not flat:
        return
    try:
        mlflow.log_params(flat)
    except mlflow.exceptions.MlflowException:
        if missing():
            raise


def log_metrics(metrics: dict, cost: dict | None = None, prefix: str = "", step: int | None = None) -> None:
    import mlflow

    mlflow.log_metrics(metric_values(metrics, cost, prefix), step=step)


def log_file(path: str | Path, artifact_dir: str | None = None) -> None:
    import mlflow

    path = Path(path)
    assert_no_secret_files(path)
    (mlflow.log_artifacts if path.is_dir() else mlflow.log_artifact)(str(path), artifact_dir)


def assert_no_secret_files(path: Path) -> None:
    """``assert_no_secrets`` on the file ``path``, or on every file under the folder ``path``."""
    for f in [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]:
        assert_no_secrets(f.read_text(encoding="utf-8", errors="replace"), str(f))


@contextlib.contextmanager
def autolog_compiles():
    """Inside the block, record the optimizer's progress (child runs per evaluation) without a trace per LM call.
    Autologging patches DSPy for the whole process: it is switched off on the way out, so that a later compile in
    the same process does not log to this run's tracking server."""
    import mlflow

    mlflow.dspy.autolog(log_traces=False, log_traces_from_compile=False, log_traces_from_eval=False,
                        log_compiles=True, log_evals=True, silent=True)
    try:
        yield
    finally:
        mlflow.dspy.autolog(disable=True, silent=True)
