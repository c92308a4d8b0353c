"""The study: where trials live, how many a search runs, and which workers still hold one.

Studies live in an Optuna storage (SQLite, or PostgreSQL for workers on many hosts), so a search resumes where it
stopped and workers share it. A killed worker's trial is failed as soon as a worker on its host sees the process gone
(``fail_dead_trials``), elsewhere by Optuna's heartbeat; the next worker to see the failure ends its MLflow run
(``end_failed_trial_runs``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from urllib.parse import urlsplit

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from chateval_dspy.errors import ConfigError
from optim.search.space import OBJECTIVES
from optim.search.worker import Worker, dead
from optim.tracking import stores
from optim.tracking.stores import redact_url

log = logging.getLogger(__name__)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
HEARTBEAT_S, GRACE_S = 60, 180


def open_storage(url: str):
    """An RDB storage with heartbeats (a crashed worker's trial is failed after 3 minutes), or ``url`` as given.
    Workers that start at the same moment wait for the first to create the tables (``stores.init_lock``)."""
    kind = stores.backend(url)
    if kind is None:
        return url  # a journal storage or another URL Optuna resolves itself
    # SQLite: wait for a busy file rather than fail at once. PostgreSQL: a long trial may outlive a pooled connection
    # that the server or a firewall dropped meanwhile; check it before use.
    kwargs = {"sqlite": {"connect_args": {"timeout": 60}}, "postgresql": {"pool_pre_ping": True}}.get(kind, {})
    with stores.init_lock(url, "optuna"), warnings.catch_warnings():
        # Heartbeats are "experimental" since Optuna 2.9, and documented.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)


def storage_label(url: str) -> str:
    """What a card or an MLflow param says of a study's storage: its kind and database name, never its host, port,
    user, password or a path on this machine (a card travels with the model to wherever it is served).

    Example:
        >>> storage_label("postgresql://optuna:s3cret@db.internal:5432/optuna?sslmode=require")
        'postgresql:optuna'
        >>> storage_label("sqlite:////home/me/mlruns/optuna.db"), storage_label("not a url")
        ('sqlite:optuna.db', 'storage')
    """
    scheme, sep, _ = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return "storage"
    try:
        name = urlsplit(url).path.rstrip("/").rpartition("/")[2]
    except ValueError:
        name = ""
    return f"{scheme}:{name}" if name else scheme


def make_sampler(seed: int, slot: int | None = None) -> optuna.samplers.TPESampler:
    """TPE seeded by the search seed and, once known, the trial's slot: one seed per process would replay the same
    start-up draws in a resumed study and in every worker; by slot each trial is reproducible, distinct from the
    others, and the same for a trial that retries a failed one."""
    mixed = seed if slot is None else int(np.random.SeedSequence([seed, slot]).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=mixed)


def open_study(name: str, storage: str, objectives: Sequence[str], *, seed: int = 0, prune: bool = True,
               warmup_steps: int = 0) -> optuna.Study:
    """Create the study or load it to resume; pruning applies to single-objective studies only."""
    directions = [OBJECTIVES[o] for o in objectives]
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup_steps)
              if prune and len(directions) == 1 else optuna.pruners.NopPruner())
    study = optuna.create_study(study_name=name, storage=open_storage(storage), load_if_exists=True,
                                directions=directions, sampler=make_sampler(seed), pruner=pruner)
    found = [d.name.lower() for d in study.directions]
    if found != directions:
        raise ConfigError(f"study {name!r} optimises {found}, not {directions}; pass --study with another name")
    return study


def check_settings(study: optuna.Study, settings: dict) -> None:
    """Record what the study's figures depend on, or refuse to mix in trials measured differently."""
    known = claim_attr(study, "settings", settings)
    changed = sorted(k for k in set(known) | set(settings) if known.get(k) != settings.get(k))
    if changed:
        diff = "; ".join(f"{k}: study has {known.get(k)!r}, now {settings.get(k)!r}" for k in changed)
        raise ConfigError(f"study {study.study_name!r} was run with other settings ({diff}); "
                          "use the same flags to resume it, or pass --study with a new name")


def claim_attr(study: optuna.Study, key: str, value):
    """Set the study's user attribute ``key`` to ``value`` unless some worker set it first; returns what it holds.

    ``set_user_attr`` overwrites, so two workers would each believe their value won: in an RDB storage the row is
    inserted under its unique (study, key) constraint, and the worker whose insert fails reads the winner's value.
    Other storages (in memory: one process; journal files) check, then set.
    """
    held = study.user_attrs.get(key)
    if held is not None:
        return held
    storage = getattr(study._storage, "_backend", study._storage)  # Optuna wraps an RDB storage in a cache
    if not isinstance(storage, optuna.storages.RDBStorage):
        study.set_user_attr(key, value)
        return value
    from optuna.storages._rdb.models import StudyUserAttributeModel
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.orm import Session

    study_id = storage.get_study_id_from_name(study.study_name)
    with Session(storage.engine) as session:
        session.add(StudyUserAttributeModel(study_id=study_id, key=key, value_json=json.dumps(value)))
        try:
            session.commit()
            return value
        except IntegrityError:
            session.rollback()
    return study.user_attrs[key]


def count(study: optuna.Study, states: Sequence[TrialState] = FINISHED) -> int:
    return len(study.get_trials(deepcopy=False, states=tuple(states)))


def remaining(study: optuna.Study, n_trials: int) -> int:
    """Trials still to start: running trials of other workers count as taken."""
    return n_trials - count(study, (*FINISHED, TrialState.RUNNING))


def fail_dead_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Fail the RUNNING trials whose worker has died, so that their budget is run again; returns them. A worker on
    this host is checked at once (its pid); one elsewhere after the heartbeat grace period."""
    ended = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if dead(t.user_attrs.get("worker")):
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            log.info("trial %d: its worker %s has died; failed, its panel is drawn again", t.number,
                     t.user_attrs.get("worker"))
            ended.append(t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    return ended


class SurplusTrial(Exception):
    """Another worker took the last trial of the budget between our check and our start."""


class _QuietSurplus(logging.Filter):
    """Optuna logs every failed trial with its traceback; a surplus trial is an expected stop, not a failure."""

    def __init__(self):
        super().__init__()
        self.trials: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        number = message.split(" ")[1] if message.startswith("Trial ") else None
        if "SurplusTrial" in message:
            self.trials.add(number)
        return number not in self.trials


# The logger Optuna reports failed trials on (optuna/study/_optimize.py); were it renamed, the filter does nothing.
_TRIAL_LOG = logging.getLogger("optuna.study._optimize")


def run_trials(study: optuna.Study, objective, n_trials: int, callbacks: Sequence[Callable] = (), *,
               wait: bool = False, poll: float = 1.0, on_wait: Callable[[int], None] | None = None,
               on_failed: Callable[[list[FrozenTrial]], None] | None = None) -> list[int]:
    """Run trials until the study holds ``n_trials`` finished (complete or pruned) ones; returns the numbers run here.

    A finished trial is never rerun; a failed one (an interrupt, an error, a dead worker) stays failed and does not
    count. ``objective.last`` is the trial it ran.

    Args:
        wait: Once the budget is taken, wait for trials still running in other workers, and run again any that
            fails meanwhile: the study is complete when this returns (``poll``: seconds between looks).
        on_wait: Called with the number of trials still running elsewhere, whenever it changes.
        on_failed: Called with the failed trials not shown yet (all at first, then each failed since, by any
            worker or the heartbeat), before any trial runs again.
    """
    ran: list[int] = []
    waiting = None
    seen: set[int] = set()
    while True:
        fail_dead_trials(study)
        failed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if t.number not in seen]
        if failed and on_failed:
            on_failed(failed)
        seen.update(t.number for t in failed)
        if remaining(study, n_trials) > 0:
            if not _one_trial(study, objective, callbacks, ran) and not wait:
                return ran  # another worker took the last trial of the budget
            continue
        if not wait:
            return ran
        running = _awaited(study)
        if not running:
            return ran
        if running != waiting and on_wait:
            on_wait(running)
        waiting = running
        time.sleep(poll)


def _awaited(study: optuna.Study) -> int:
    """Trials running in other workers that will end one way or another: those of a worker on this host (a dead
    one was failed above), and any at all where heartbeats fail a dead worker's trial. Waiting for a trial of
    another host in a storage without heartbeats (a journal file) could last forever."""
    backend = getattr(study._storage, "_backend", study._storage)
    heartbeats = getattr(backend, "get_heartbeat_interval", lambda: None)() is not None
    here = Worker.current().host
    return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
               if heartbeats or getattr(Worker.parse(t.user_attrs.get("worker")), "host", None) == here)


def _one_trial(study: optuna.Study, objective, callbacks, ran: list[int]) -> bool:
    """Run one trial; False when another worker took the last of the budget first."""
    objective.last = None
    quiet = _QuietSurplus()
    _TRIAL_LOG.addFilter(quiet)
    try:
        study.optimize(objective, n_trials=1, callbacks=list(callbacks), gc_after_trial=False)
    except SurplusTrial as exc:
        log.info("%s", exc)
        return False
    finally:
        _TRIAL_LOG.removeFilter(quiet)
    if objective.last is not None:
        ran.append(objective.last)
    return True


NOTE_TAG = "mlflow.note.content"  # the run's description in MLflow's UI


def end_failed_trial_runs(failed: Sequence[FrozenTrial], uri: str | None = None) -> list[str]:
    """End as KILLED, with a note saying why, the MLflow runs of failed trials that are still RUNNING; returns their
    ids. A SIGKILLed worker cannot end its trial's run, nor does failing the trial: whichever worker sees it FAIL
    does (``end_dead_runs`` covers only dead workers of this host, as a worker starts)."""
    import mlflow

    from optim.tracking import runs as tracking

    wanted = {t.user_attrs["mlflow_run_id"]: t for t in failed if t.user_attrs.get("mlflow_run_id")}
    if not wanted:
        return []
    tracking.setup(uri)
    client = mlflow.MlflowClient()
    ended = []
    for run_id, trial in wanted.items():
        try:
            if client.get_run(run_id).info.status != "RUNNING":
                continue
        except mlflow.exceptions.MlflowException:  # deleted, or in another store
            continue
        note = (f"Ended by worker {Worker.current().tag()}: Optuna failed trial {trial.number} "
                f"(its worker {trial.user_attrs.get('worker')} died or stopped sending heartbeats), so this run "
                "would never end by itself. A failed trial does not count: the study runs another in its place.")
        client.set_tag(run_id, NOTE_TAG, note)
        tracking.end_run(run_id, "KILLED", uri)
        log.info("trial %d failed: its MLflow run %s ended as KILLED", trial.number, run_id)
        ended.append(run_id)
    return ended


def best_trial(study: optuna.Study) -> FrozenTrial:
    """The best complete trial; with several objectives, the Pareto trial with the best agreement, then the best of
    each later objective in turn (the lowest cost: tokens or a cascade's dollars; the highest robustness). Trials with
    a figure that is not finite (a cascade that reached no threshold) are chosen only when every Pareto trial has
    one."""
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        raise ConfigError(f"study {study.study_name!r} has no complete trial yet")
    if len(study.directions) == 1:
        return study.best_trial
    front = study.best_trials
    finite = [t for t in front if all(math.isfinite(v) for v in t.values)]
    signs = [1 if d == optuna.study.StudyDirection.MAXIMIZE else -1 for d in study.directions]
    return max(finite or front, key=lambda t: (*(s * v for s, v in zip(signs, t.values)), -t.number))


@contextlib.contextmanager
def study_run(study: optuna.Study, *, params: dict, uri: str | None = None) -> Iterator:
    """The study's MLflow parent run (no worker tag: it is shared), created by the first worker: workers starting a
    new study together each create one and claim the study's attribute for it, and the losers delete theirs."""
    from optim.tracking import runs as tracking

    uri_key = tracking.tracking_uri(uri)
    shown = redact_url(uri_key)  # a password in the tracking URI stays out of the study's attributes and the log
    attr = "mlflow_run:" + hashlib.sha256(shown.encode()).hexdigest()[:16]
    runs = dict(study.user_attrs.get("mlflow_runs") or {})  # {uri: run id}, what `chateval report` reads
    run_id = study.user_attrs.get(attr) or runs.get(shown)
    new_run = partial(tracking.create_run, f"search-{study.study_name}", uri=uri,
                      tags={"command": "search", "optuna.study": study.study_name})
    if run_id and not tracking.run_exists(run_id, uri):
        log.warning("the study's MLflow run %s is gone from %s; starting a new one", run_id, shown)
        run_id = new_run()
        study.set_user_attr(attr, run_id)
    elif not run_id:
        candidate = new_run()
        run_id = claim_attr(study, attr, candidate)
        if run_id != candidate:
            tracking.delete_run(candidate)
    if runs.get(shown) != run_id:
        runs[shown] = run_id
        study.set_user_attr("mlflow_runs", runs)
    with tracking.run(f"search-{study.study_name}", params=params, uri=uri, run_id=run_id) as active:
        yield active
