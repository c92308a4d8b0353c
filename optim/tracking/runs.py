"""MLflow runs, metrics, params and artifacts (the models are ``optim.tracking.models``'s).

Default store: ``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/`` in the
working directory; ``--tracking-uri`` or ``MLFLOW_TRACKING_URI`` choose another (``postgresql://...``, or an
``http://`` tracking server shared by workers on many hosts). A database store is created by the first process to
open it while any others starting with it wait (``optim.tracking.stores``).
Params are the run's ``DebateConfig`` plus model, data and split: no secret has a way in,
and ``assert_no_secrets`` double-checks every text before it is logged. Traces (``--trace``) are
built by ``chateval_dspy.run.tracing``, which scrubs the same secrets from every span.

A run is RUNNING from the moment a command opens it (before any item is judged) and ends FINISHED,
FAILED (an exception) or KILLED (Ctrl-C or SIGTERM: see ``run``). A SIGKILL cannot be caught and leaves
the run RUNNING: each run is tagged with its worker (``chateval.worker``, host, pid and process start
time), so the rerun of the same command finds it and ends it as KILLED (``end_dead_runs``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
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
    """Whether and where a compile or search is logged to MLflow.

    Args:
        enabled: Log at all (the CLI's ``--no-mlflow`` turns it off).
        uri: The tracking URI (default: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlruns/mlflow.db``).
        log_model: Log the saved program as MLflow models (the pyfunc and the dspy flavour; compile and search).
        register: Register the pyfunc model under this name (compile, search).
        wheelhouse: Put the wheels of the pyfunc model's environment in it (``models.log_pyfunc_model``).

    Example:
        >>> TrackingSpec(enabled=False).enabled
        False
    """

    enabled: bool = True
    uri: str | None = None
    log_model: bool = True
    register: str | None = None
    wheelhouse: bool = False


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


def setup(uri: str | None = None, experiment: str = EXPERIMENT) -> str:
    """Point MLflow at the store and experiment; artifacts of the local store live under ``mlruns/``.

    A database store (SQLite, PostgreSQL) is first opened under ``optim.tracking.stores.init_lock``: MLflow creates its
    tables on first use, and workers that start together on a fresh store would each run the migrations.
    """
    import mlflow

    from optim.tracking import stores

    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    with contextlib.nullcontext() if uri in _OPENED else stores.init_lock(uri, "mlflow"):
        mlflow.set_experiment(experiment)  # with the sqlite store, artifacts land in ./mlruns/<experiment>/<run>
    _OPENED.add(uri)
    return uri


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


def start_tracing(uri: str | None = None, experiment: str = EXPERIMENT) -> str:
    """Point MLflow at the store and experiment that traces go to; returns the experiment id."""
    import mlflow

    setup(uri, experiment)
    return mlflow.get_experiment_by_name(experiment).experiment_id


def tracer_for(flag: bool | None, *, items: list, config, uri: str | None = None, mlflow_target: bool = True,
               tags: dict | None = None):
    """A ``Tracer`` for a batch when the tracing rule says so (``chateval_dspy.run.tracing.tracing_default``),
    pointed at the tracking store; else None.

    Args:
        flag: ``--trace`` (True), ``--no-trace`` (False) or neither (None: the rule decides).
        items: The items the batch judges (counted by the rule; their texts go into the traces).
        config: The panel (``DebateConfig``), or a function of the format that returns it.
        uri: The tracking URI.
        mlflow_target: Whether the run logs to MLflow (``chateval evaluate`` without ``--no-mlflow``).
        tags: Tags for every trace.
    """
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


def worker_tags() -> dict[str, str]:
    from optim.search.worker import Worker

    return {WORKER_TAG: Worker.current().tag()}


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
    """Inside the block, MLflow does not print its "View run ... at" / "View experiment at" lines.

    MLflow prints both whenever a run on a tracking server ends, a child run too (an ablation's variant, a search's
    trial, each evaluation an optimizer logs), burying the command's own output; each command prints its run id
    once instead. MLflow reads the switch when a run ends, so it is set only while runs are open, never at import.
    A setting of the user's own is left as it is.
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

    The run is RUNNING while the block runs and ends by how the block ends (``run_status``): FINISHED, FAILED
    (an exception), KILLED (Ctrl-C, or SIGTERM, which a run that is not nested turns into ``Terminated`` while
    it is open). ``run_id`` resumes that run instead of starting one. A new run is tagged with this worker, so a
    rerun can end it as KILLED should this process be killed by a signal that cannot be caught (``end_dead_runs``).
    """
    import mlflow

    if not nested:
        setup(uri)
    tags = {**(tags or {}), **({} if run_id else worker_tags())}
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

    setup(uri)
    assert_no_secrets(repr(tags), "tags")
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    return mlflow.MlflowClient().create_run(experiment.experiment_id, run_name=name, tags=tags).info.run_id


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
    running = client.search_runs([run.info.experiment_id], "attributes.status = 'RUNNING'", max_results=5000)
    _end_tree(client, run_id, status, {r.info.run_id: r for r in running})


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


def end_dead_runs(scope: dict[str, str], uri: str | None = None,
                  is_dead: Callable[[str], bool] | None = None) -> list[str]:
    """End as KILLED every RUNNING run whose tags include ``scope`` and whose worker has certainly died.

    Args:
        scope: Tags that pick this command's own runs (``{"chateval.out": ...}``, ``{"optuna.study": ...}``).
        uri: The tracking URI.
        is_dead: ``is_dead(worker tag) -> bool`` (default: same host and the process is gone).

    Returns the ids of the runs ended, children included.
    """
    import mlflow

    from optim.search.worker import dead

    is_dead = is_dead or dead
    setup(uri)
    client = mlflow.MlflowClient()
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    running = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id],
                                                            "attributes.status = 'RUNNING'", max_results=5000)}
    ended: list[str] = []
    for run_id, r in list(running.items()):
        tags = r.data.tags
        if all(tags.get(k) == v for k, v in scope.items()) and WORKER_TAG in tags and is_dead(tags[WORKER_TAG]) \
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

    Workers that share a study's parent run log the same params into it, and MLflow refuses a
    param written twice at the same moment: the one that loses finds the values there and goes on.
    A param with another value is still an error, as MLflow makes it.
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
    if path.is_dir():
        for f in path.rglob("*"):
            if f.is_file():
                assert_no_secrets(f.read_text(encoding="utf-8", errors="replace"), str(f))
        mlflow.log_artifacts(str(path), artifact_dir)
    else:
        assert_no_secrets(path.read_text(encoding="utf-8", errors="replace"), str(path))
        mlflow.log_artifact(str(path), artifact_dir)


@contextlib.contextmanager
def autolog_compiles():
    """Inside the block, record the optimizer's progress (child runs per evaluation) without a trace per LM call.

    MLflow's autologging patches DSPy for the whole process; it is switched off again on the way out, so a later
    compile in the same process (a notebook, a test) does not log to this run's tracking server, gone or not.
    """
    import mlflow

    mlflow.dspy.autolog(log_traces=False, log_traces_from_compile=False, log_traces_from_eval=False,
                        log_compiles=True, log_evals=True, silent=True)
    try:
        yield
    finally:
        mlflow.dspy.autolog(disable=True, silent=True)
