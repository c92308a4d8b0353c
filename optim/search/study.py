"""Optuna search over panel shapes: ``trial.suggest_*`` -> ``DebateConfig`` -> ``build_evaluator`` -> dev agreement.

A trial chooses the referees (a subset of the five built-in personas, or the same-role
ablation), the number of turns, the strategy, the aggregation and, if asked, how to
compile; it is then judged on the dev split with the same ``evaluate`` the CLI uses.
Studies live in an Optuna storage (default ``sqlite:///mlruns/optuna.db``), so an
interrupted search resumes where it stopped and several workers can share one study.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from chateval_dspy.config import AGGREGATES, DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.program.roles import DEFAULT_ORDER, same_roles
from chateval_dspy.program.signatures import ASPECTS
from chateval_dspy.program.strategies import STRATEGIES
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.metrics import primary_metric
from chateval_dspy.run.result import RunResult

log = logging.getLogger(__name__)

OBJECTIVES = {"agreement": "maximize", "tokens": "minimize"}
COMPILE_CHOICES = ("none", "labeled", "bootstrap")
PANELS = ("distinct", "same")
DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass(frozen=True)
class SearchSpace:
    """What a trial may choose; a dimension with a single value is fixed.

    Args:
        panels: ``distinct`` (a subset of the built-in personas) and/or ``same`` (the same-role ablation).
        n_roles: Smallest and largest panel size (1-5).
        turns: Fewest and most rounds of talk (1-4 in the paper's range, any positive range allowed).
        strategies: Strategy names to choose from.
        aggregates: ``mean`` and/or ``majority``.
        compile: ``none``, ``labeled``, ``bootstrap``: one fixes it, several let the trial choose.

    Example:
        >>> SearchSpace(turns=(2, 2)).to_dict()["turns"]
        [2, 2]
    """

    panels: tuple[str, ...] = PANELS
    n_roles: tuple[int, int] = (1, len(DEFAULT_ORDER))
    turns: tuple[int, int] = (1, 4)
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    aggregates: tuple[str, ...] = AGGREGATES
    compile: tuple[str, ...] = ("none",)

    def __post_init__(self) -> None:
        for name, allowed in (("panels", PANELS), ("strategies", tuple(STRATEGIES)), ("aggregates", AGGREGATES),
                              ("compile", COMPILE_CHOICES)):
            values = tuple(getattr(self, name))
            if not values:
                raise ConfigError(f"the search space needs at least one of {name}: {', '.join(allowed)}")
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise ConfigError(f"unknown {name} {unknown}; choose from: {', '.join(allowed)}")
            object.__setattr__(self, name, tuple(dict.fromkeys(values)))
        low, high = self.n_roles
        if not 1 <= low <= high <= len(DEFAULT_ORDER):
            raise ConfigError(f"panel size must lie in 1..{len(DEFAULT_ORDER)} (the built-in personas), got {low}..{high}")
        low, high = self.turns
        if not 1 <= low <= high:
            raise ConfigError(f"turns must be a positive range, got {low}..{high}")

    def to_dict(self) -> dict:
        return {k: list(v) for k, v in asdict(self).items()}


def persona_sets(n: int) -> list[str]:
    """Every set of ``n`` built-in personas, in the paper's speaking order, as ``a+b`` strings.

    Example:
        >>> persona_sets(4)[0]
        'general_public+critic+news_author+psychologist'
    """
    return ["+".join(c) for c in itertools.combinations(DEFAULT_ORDER, n)]


def suggest_config(trial: optuna.Trial, space: SearchSpace, base: DebateConfig) -> tuple[DebateConfig, str]:
    """The trial's panel as a ``DebateConfig`` (everything not searched comes from ``base``) and its compile choice.

    Parameters: ``panel`` (distinct/same), ``n_roles``, ``personas_<n>`` (distinct panels of 1-4),
    ``turns``, ``strategy``, ``aggregate``, ``compile``. Persona sets are one categorical per
    panel size, so ``n_roles`` stays a parameter of its own (the paper's Figure 3 axis).

    Example:
        >>> trial = optuna.trial.FixedTrial({"panel": "same", "n_roles": 3, "turns": 2, "strategy": "one_by_one",
        ...                                  "aggregate": "mean", "compile": "none"})
        >>> suggest_config(trial, SearchSpace(), DebateConfig())[0].roles
        ('referee_1', 'referee_2', 'referee_3')
    """
    panel = trial.suggest_categorical("panel", space.panels)
    n = trial.suggest_int("n_roles", *space.n_roles)
    if panel == "same":
        roles = same_roles(n)
    else:
        choices = persona_sets(n)  # a panel of all five has nothing to choose
        roles = tuple((trial.suggest_categorical(f"personas_{n}", choices) if len(choices) > 1 else choices[0]).split("+"))
    turns = trial.suggest_int("turns", *space.turns)
    strategy = trial.suggest_categorical("strategy", space.strategies)
    aggregate = trial.suggest_categorical("aggregate", space.aggregates)
    compile_choice = trial.suggest_categorical("compile", space.compile)
    return base.replace(roles=roles, turns=turns, strategy=strategy, aggregate=aggregate), compile_choice


def parse_objectives(text: str) -> tuple[str, ...]:
    """``agreement`` or ``agreement,tokens``: agreement always comes first (it picks the final program)."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    if names not in (("agreement",), ("agreement", "tokens")):
        raise ConfigError(f"--objectives must be 'agreement' or 'agreement,tokens', got {text!r}")
    return names


def default_study_name(dataset: str, objectives: Sequence[str]) -> str:
    stem = Path(dataset).stem if Path(dataset).suffix else dataset
    return f"{stem}-{'-'.join(objectives)}"


def redact_url(url: str) -> str:
    """A storage URL fit to print and log: any password is masked."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def open_storage(url: str):
    """An RDB storage with heartbeats (a crashed worker's trial is failed after 3 minutes), or ``url`` as given."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if str(path) not in ("", ":memory:"):
            path.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith(("sqlite:", "postgresql", "mysql")):
        from sqlalchemy.exc import SQLAlchemyError

        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else {}
        for attempt in range(5):
            try:
                with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9, and documented
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=60,
                                                      grace_period=180)
            except SQLAlchemyError:
                # Workers that open a new storage at the same moment race to create its tables; the loser retries.
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
    return url


def make_sampler(seed: int, number: int | None = None) -> optuna.samplers.TPESampler:
    """TPE seeded by the search seed and, once known, the trial number.

    One fixed seed per process would replay the same random start-up draws in a resumed
    study and in every worker; seeding by trial number keeps each trial reproducible and
    distinct from the others.
    """
    if number is None:
        return optuna.samplers.TPESampler(seed=seed)
    mixed = int(np.random.SeedSequence([seed, number]).generate_state(1)[0])
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
    known = study.user_attrs.get("settings")
    if known is None:
        study.set_user_attr("settings", settings)
        return
    changed = sorted(k for k in set(known) | set(settings) if known.get(k) != settings.get(k))
    if changed:
        diff = "; ".join(f"{k}: study has {known.get(k)!r}, now {settings.get(k)!r}" for k in changed)
        raise ConfigError(f"study {study.study_name!r} was run with other settings ({diff}); "
                          "use the same flags to resume it, or pass --study with a new name")


def count(study: optuna.Study, states: Sequence[TrialState] = FINISHED) -> int:
    return len(study.get_trials(deepcopy=False, states=tuple(states)))


def remaining(study: optuna.Study, n_trials: int) -> int:
    """Trials still to start: running trials of other workers count as taken."""
    return n_trials - count(study, (*FINISHED, TrialState.RUNNING))


def agreement_of(fmt: str, metrics: dict) -> float:
    """The figure a study optimises: accuracy (pairwise) or average Spearman (scoring); NaN if undefined."""
    if not metrics:
        return math.nan
    estimate = metrics[primary_metric(fmt)]
    return float(estimate.value)


def running_agreement(result: RunResult) -> float:
    """The same figure without bootstrap (for pruning after each chunk of dev items)."""
    from chateval_dspy.run.metrics import accuracy, spearman

    if not result.human:
        return math.nan
    if result.config.format == "pairwise":
        return accuracy(result.human, result.predicted)
    pairs = [(h, p) for h, p in zip(result.human, result.predicted) if p is not None]
    return float(np.mean([spearman([h[a] for h, _ in pairs], [p[a] for _, p in pairs]) for a in ASPECTS]))


def tokens_per_item(result: RunResult) -> float:
    cost = result.cost()
    return cost["prompt_tokens_per_item"] + cost["completion_tokens_per_item"]


def build_for_trial(config: DebateConfig, compile_choice: str, trainset: Sequence, *, max_demos: int = 2,
                    seed: int = 0) -> ChatEval:
    """``build_evaluator(config)``, compiled on ``trainset`` when the trial chose to compile."""
    program = build_evaluator(config)
    if compile_choice == "none":
        return program
    from optim.compile import OptimizerSettings, compile_evaluator
    from optim.objectives import make_metric

    if not trainset:
        raise ConfigError("compiling needs a non-empty train split: use more items or a larger --limit")
    metric_name = "agreement" if config.format == "pairwise" else "score_error"
    return compile_evaluator(program, optimizer=compile_choice, trainset=trainset, valset=None,
                             metric=make_metric(metric_name, config.format, trainset),
                             settings=OptimizerSettings(max_demos=max_demos, seed=seed))


def config_of(trial: FrozenTrial) -> tuple[DebateConfig, str]:
    """The config and compile choice a finished trial recorded."""
    return DebateConfig.from_dict(trial.user_attrs["config"]), trial.user_attrs.get("compile", "none")


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


@dataclass
class Objective:
    """One trial: suggest a panel, build (and maybe compile) it, judge the dev split in chunks.

    Returns dev agreement, or ``(agreement, tokens per dev item)`` for two objectives. An
    undefined agreement (scoring: a constant column has no Spearman) counts as 0.0, the
    value of a panel whose scores carry no ranking, and the trial is marked
    ``agreement_undefined``; failing the trial instead would hide it from the sampler and
    never count toward ``--trials``.

    Args:
        space: What trials may choose.
        base: Everything else (format, calibration, limits); its panel is replaced by each trial's.
        parts: The train and dev splits (already limited); train is used only by trials that compile.
        objectives: ``("agreement",)`` or ``("agreement", "tokens")``.
        n_trials: The study's budget; a trial started past it (a race between workers) stops.
        report_every: Dev items per chunk; pruning may stop a trial after any chunk but the last.
        results_dir: Where each trial's dev results JSONL goes (``trial-0007-dev.jsonl``).
        track: Log each trial as a nested MLflow run under the active (study) run.
        on_item: Called with each judged record (the CLI's progress bar).

    Example:
        >>> objective = Objective(space=SearchSpace(), base=DebateConfig(), parts=parts,  # doctest: +SKIP
        ...                       objectives=("agreement",), n_trials=20)
        >>> study.optimize(objective, n_trials=1)  # doctest: +SKIP
    """

    space: SearchSpace
    base: DebateConfig
    parts: dict
    objectives: tuple[str, ...] = ("agreement",)
    n_trials: int | None = None
    seed: int = 0
    max_demos: int = 2
    report_every: int = 4
    concurrency: int = 1
    results_dir: Path | None = None
    track: bool = False
    on_item: Callable[[dict], None] | None = None
    last: int | None = field(default=None, init=False)

    def __call__(self, trial: optuna.Trial):
        self.last = trial.number
        if self.n_trials is not None:
            ahead = [t for t in trial.study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
                     if t.number < trial.number]
            if len(ahead) >= self.n_trials:
                trial.set_user_attr("surplus", True)
                raise SurplusTrial(f"the study already holds {len(ahead)} trials; this worker stops")
        trial.study.sampler = make_sampler(self.seed, trial.number)
        config, compile_choice = suggest_config(trial, self.space, self.base)
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("compile", compile_choice)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        same = self._duplicate_of(trial)
        if not self.track:
            return self._reuse(trial, same) if same else self._run(trial, config, compile_choice)
        from optim import tracking

        tags = {"optuna.study": trial.study.study_name, "optuna.trial": str(trial.number)}
        if same:
            tags["duplicate_of"] = str(same.number)
        pruned = values = None
        with tracking.run(f"trial-{trial.number}", nested=True, tags=tags,
                          params={"trial": trial.number, "config": config.to_dict(), "compile": compile_choice}) as active:
            trial.set_user_attr("mlflow_run_id", active.info.run_id)
            try:
                values = self._reuse(trial, same) if same else self._run(trial, config, compile_choice, tracking)
            except optuna.TrialPruned as exc:  # the MLflow run still ends as FINISHED, with what was measured
                pruned = exc
                tracking.log_metrics({"pruned": 1.0})
            if same and values is not None:
                tracking.log_metrics(dict(zip(("objective.agreement", "objective.tokens_per_item"),
                                              values if isinstance(values, tuple) else (values,))))
            elif self.results_dir and trial.user_attrs.get("results"):
                tracking.log_file(trial.user_attrs["results"], "results")
        if pruned is not None:
            raise pruned
        return values

    def _duplicate_of(self, trial: optuna.Trial) -> FrozenTrial | None:
        """A finished trial with the very same parameters: its figures are reused, nothing is judged twice."""
        for t in trial.study.get_trials(deepcopy=False, states=FINISHED):
            if t.number != trial.number and t.params == trial.params:
                return t
        return None

    def _reuse(self, trial: optuna.Trial, same: FrozenTrial):
        trial.set_user_attr("duplicate_of", same.user_attrs.get("duplicate_of", same.number))
        for key in ("dev", "cost", "agreement_undefined", "results"):
            if key in same.user_attrs:
                trial.set_user_attr(key, same.user_attrs[key])
        if same.state == TrialState.PRUNED:
            raise optuna.TrialPruned(f"same parameters as pruned trial {same.number}")
        return same.values[0] if len(same.values) == 1 else tuple(same.values)

    def _run(self, trial: optuna.Trial, config: DebateConfig, compile_choice: str, tracking=None):
        from chateval_dspy.run.metrics import plain

        program = build_for_trial(config, compile_choice, self.parts["train"], max_demos=self.max_demos, seed=self.seed)
        dev = self.parts["dev"]
        out = None
        if self.results_dir:
            out = Path(self.results_dir) / f"trial-{trial.number:04d}-dev.jsonl"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("", encoding="utf-8")
            trial.set_user_attr("results", str(out))
        result = RunResult(config)

        def judged(record: dict) -> None:
            result.add(record)
            if self.on_item:
                self.on_item(record)

        prune = len(self.objectives) == 1
        step = max(1, self.report_every)
        for start in range(0, len(dev), step):
            chunk = evaluate(program, dev[start:start + step], config, out=out, concurrency=self.concurrency,
                             on_item=judged)
            result.wall_seconds += chunk.wall_seconds
            value = running_agreement(result)
            if prune and not math.isnan(value):
                trial.report(value, step=result.n)
                if tracking:
                    tracking.log_metrics({"dev.running_agreement": value}, step=result.n)
                if start + step < len(dev) and trial.should_prune():
                    trial.set_user_attr("cost", result.cost())
                    raise optuna.TrialPruned(f"dev agreement {value:.3f} after {result.n} of {len(dev)} items")
        metrics, cost = result.metrics(seed=self.seed), result.cost()
        agreement = agreement_of(config.format, metrics)
        undefined = math.isnan(agreement)
        trial.set_user_attr("dev", plain(metrics))
        trial.set_user_attr("cost", cost)
        trial.set_user_attr("agreement_undefined", undefined)
        values = [0.0 if undefined else agreement]
        if "tokens" in self.objectives:
            values.append(tokens_per_item(result))
        if tracking:
            tracking.log_metrics(metrics, cost, prefix="dev.")
            tracking.log_metrics({"objective.agreement": values[0], "agreement_undefined": float(undefined),
                                  **({"objective.tokens_per_item": values[1]} if len(values) > 1 else {})})
        return values[0] if len(values) == 1 else tuple(values)


def run_trials(study: optuna.Study, objective: Objective, n_trials: int,
               callbacks: Sequence[Callable] = ()) -> list[int]:
    """Run trials until the study holds ``n_trials`` finished (complete or pruned) ones; returns the numbers run here.

    Trials numbers come from the storage, so a resumed study continues after its last trial
    and concurrent workers never share one. A finished trial is never rerun; a trial that
    failed (an interrupt, an error) stays failed and does not count.
    """
    ran = []
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # a killed worker's trial stops holding budget (heartbeats)
        if remaining(study, n_trials) <= 0:
            break
        objective.last = None
        quiet = _QuietSurplus()
        _TRIAL_LOG.addFilter(quiet)
        try:
            study.optimize(objective, n_trials=1, callbacks=list(callbacks), gc_after_trial=False)
        except SurplusTrial as exc:
            log.info("%s", exc)
            break
        finally:
            _TRIAL_LOG.removeFilter(quiet)
        if objective.last is not None:
            ran.append(objective.last)
    return ran


def best_trial(study: optuna.Study) -> FrozenTrial:
    """The best complete trial; with two objectives, the Pareto trial with the best agreement (then fewest tokens)."""
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        raise ConfigError(f"study {study.study_name!r} has no complete trial yet")
    if len(study.directions) == 1:
        return study.best_trial
    return max(study.best_trials, key=lambda t: (t.values[0], -t.values[1], -t.number))


@contextlib.contextmanager
def study_run(study: optuna.Study, *, params: dict, uri: str | None = None) -> Iterator:
    """The study's MLflow parent run: created on first use, resumed by every later worker or resume.

    Its id is kept in the study (per tracking URI), so trials from every worker and every
    resumption nest under the one run. Two workers that start a new study at the same
    instant may each create one; later workers join the one recorded last.
    """
    from optim import tracking

    key = tracking.tracking_uri(uri)
    runs = dict(study.user_attrs.get("mlflow_runs", {}))
    tags = {"command": "search", "optuna.study": study.study_name}
    with contextlib.ExitStack() as stack:
        try:
            if runs.get(key):
                # tracking.run has no run_id argument; MLflow resumes the run named by MLFLOW_RUN_ID (and unsets it).
                os.environ["MLFLOW_RUN_ID"] = runs[key]
            active = stack.enter_context(tracking.run(f"search-{study.study_name}", params=params, uri=uri, tags=tags))
        except tracking.mlflow.exceptions.MlflowException as exc:
            if not runs.get(key):
                raise
            log.warning("cannot resume the study's MLflow run %s (%s); starting a new one", runs[key], exc)
            os.environ.pop("MLFLOW_RUN_ID", None)
            active = stack.enter_context(tracking.run(f"search-{study.study_name}", params=params, uri=uri, tags=tags))
        finally:
            os.environ.pop("MLFLOW_RUN_ID", None)
        if runs.get(key) != active.info.run_id:
            runs[key] = active.info.run_id
            study.set_user_attr("mlflow_runs", runs)
        yield active
