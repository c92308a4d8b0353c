"""``chateval search`` as a function: run a study's trials, then test and save its best panel.

Rerunning the same call finishes what a killed one left (trials, their dev results, the final test, the card and the
MLflow logging). Several workers may run it on one study at once: one MLflow parent run holds every trial, and a
worker that tests waits for the others' trials, so the study ends tested whichever worker finishes last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import optuna

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.splits import dataset_hash, split_record
from chateval_dspy.errors import ConfigError
from chateval_dspy.run.evaluate_dataset import check_task, lm_slots, run_header, skipped_rows
from optim.search import study as studies
from optim.search.finish import check_out, choose_final, final_test, save_final
from optim.search.objective import Objective
from optim.search.space import SearchSpace
from optim.search.study_spec import StudySpec
from optim.tuning.cascade import IN_SAMPLE_NOTE, SearchedCascade, judge_first_stage
from optim.tuning.compile import OptimizerSettings

SEARCHED = ("roles", "turns", "strategy", "aggregate", "format")  # what a trial draws, or the data fixes


class SearchHooks:
    """What ``run_search`` tells its caller as it goes; the CLI prints it, the defaults stay silent."""

    def note(self, text: str) -> None:
        """A remark about how the search runs (the CLI prints it on stderr)."""

    def started(self, study: optuna.Study, spec: StudySpec, parts: dict) -> None:
        """The study is open and its settings checked; trials start next."""

    def item(self, record: dict) -> None:
        """One dev item judged in the current trial."""

    def trial(self, study: optuna.Study, trial) -> None:
        """A trial finished (complete, pruned or failed)."""

    def waiting(self, running: int) -> None:
        """This worker's share is done; ``running`` trials of other workers are still going."""

    def trials_done(self, study: optuna.Study, ran: list[int], finished: int) -> None:
        """No more trials here: ``ran`` were run by this worker, ``finished`` are in the study."""

    def final(self, reason: str) -> None:
        """Why this worker tests nothing now."""

    def progress(self, total: int) -> contextlib.AbstractContextManager:
        """A context yielding the per-item callback for the final test, or None."""
        return contextlib.nullcontext()

    def tested(self, trial, result, figures: dict, header: dict) -> None:
        """The best trial's figures on the test split."""


@dataclass
class SearchRun:
    """What ``run_search`` did."""

    study: optuna.Study
    ran: list[int]
    finished: int
    out: Path
    saved: bool = False
    card: dict | None = None
    mlflow_run_id: str | None = None


@dataclass
class SearchPlan:
    """What a search runs on, checked before any study opens or any LM starts."""

    items: list
    fmt: str
    base: DebateConfig
    parts: dict
    out: Path
    lm: object
    settings: OptimizerSettings


def plan_search(data, base, lm, *, spec: StudySpec, settings: OptimizerSettings | None, out, test: bool,
                concurrency: int, hooks: SearchHooks, cascade=None, gates=None) -> SearchPlan:
    """The items, fixed config, split, output folder, LM and optimizer settings of a search; ConfigError for
    anything it cannot run (``cascade``: a ``cascade_cost`` search's first stage, level and risk; ``gates``: a gate
    whose data is missing, ``optim.certify.measure.check_gate_data``)."""
    import chateval_dspy.limits as limits
    from chateval_dspy.program.roles import DEFAULT_ORDER, same_roles
    from optim.certify.measure import check_gate_data

    if data.split != "all":
        raise ConfigError("search uses the seeded train/dev/test split itself: drop --split")
    check_cascade(spec, cascade)
    if concurrency < 1:
        raise ConfigError(f"concurrency must be positive, got {concurrency}")
    items, fmt = data.load()
    base = base(fmt) if callable(base) else base
    check_task(data, base)
    # A mixed panel binds models by role slug: each must be a referee some trial can seat (checked before any model starts).
    lm.check_panel(DEFAULT_ORDER + same_roles(limits.MAX_ROLES))
    parts = data.parts(items)
    if not parts["dev"] or all(x.get("label" if fmt == "pairwise" else "human") is None for x in parts["dev"]):
        raise ConfigError("search needs labelled dev items: use a dataset with human labels, more items or a larger --limit")
    if test and not parts["test"]:
        raise ConfigError("the test split is empty: use more items or a larger --limit (or --no-test)")
    out = Path(out or Path("programs") / spec.name)
    if test:
        check_out(out, spec.name)
        check_gate_data(gates, fmt, [x.id for x in parts["test"]])
    costed = next((o for o in ("tokens", "cascade_cost") if o in spec.objectives), None)
    if costed and lm.cache:
        # A cached answer reports no usage, which would make a panel look free.
        hooks.note(f"note: {costed} is an objective, so DSPy's LM cache is off for this search")
        lm = dataclasses.replace(lm, cache=False)
    settings = dataclasses.replace(settings or OptimizerSettings(), seed=data.seed)
    return SearchPlan(items, fmt, base, parts, out, lm, settings)


def study_settings(data, plan: SearchPlan, spec: StudySpec, space: SearchSpace, cascade=None) -> dict:
    """What the study records of its search: a worker that would search otherwise is refused (``check_settings``).
    ``cascade``: a ``cascade_cost`` search's declared first stage, level and risk (recorded only then, so that
    existing studies resume as they were)."""
    lm, stage = plan.lm, cascade.stages[0] if cascade else None  # check_cascade: a cascade has one stage
    return {**({"cascade": {"first_stage": str(stage.program), "model": stage.model, "level": cascade.level,
                            "risk": cascade.risk}} if cascade else {}),
            "dataset": data.dataset, "format": plan.fmt, "dataset_hash": dataset_hash(plan.items), "seed": data.seed,
            "limit": data.limit, "objectives": list(spec.objectives), "space": space.to_dict(),
            # The fixed part of every trial's config, by its changes only: a field added to DebateConfig later, at
            # its default, does not stop an older study from resuming.
            "model_spec": lm.model, "base": {k: v for k, v in plan.base.changes().items() if k not in SEARCHED},
            "max_demos": plan.settings.max_demos if space.compile != ("none",) else None,
            # Only a mixed panel records its referees' models, and only the reading flags given (a worker reading
            # labels otherwise is refused: some, like --skip-bad-rows, leave the hash alone), so that existing
            # studies resume as they were.
            **({"referee_models": lm.referee_map} if lm.referee_models else {}),
            **({"data": stated} if (stated := {k: v for k, v in data.reading().items() if v not in ("-", "false")})
               else {})}


def check_cascade(spec: StudySpec, cascade) -> None:
    """A ``cascade_cost`` search has exactly one declared first stage, and only it has one."""
    wanted = "cascade_cost" in spec.objectives
    if wanted and cascade is None:
        raise ConfigError("the cascade_cost objective needs the cascade's first stage: --first-stage PROGRAM_DIR "
                          "(a saved cheap evaluator) with --agree-at-least LEVEL --risk R")
    if not wanted and cascade is not None:
        raise ConfigError("--first-stage, --agree-at-least and --risk are for --objectives agreement,cascade_cost")
    if wanted and len(cascade.stages) != 1:
        raise ConfigError(f"a searched cascade declares one first stage (each trial's panel is the second), got "
                          f"{len(cascade.stages)}")


def first_stage(data, plan: SearchPlan, spec: StudySpec, cascade, *, concurrency: int, hooks: SearchHooks):
    """The cascade's first stage judged once on the dev items (``results/<study>/first-stage/``: a rerun or another
    worker reads it back), as every trial's ``SearchedCascade``; it must judge the search's task."""
    from chateval_dspy.deploy.saved.store import load_program

    (stage,) = cascade.stages
    program, _ = load_program(stage.program)
    if program.config.task_spec != plan.base.task_spec:
        raise ConfigError(f"--first-stage {stage.program} judges task {program.config.task_spec.name!r}, the search "
                          f"{plan.base.task_spec.name!r}: both stages of a cascade judge the same task")
    dev = plan.parts["dev"]
    header = {"data": data.dataset if len(data.dataset) <= 200 else data.name, "split": f"dev (seed {data.seed})",
              "seed": data.seed}
    hooks.note(f"first stage {stage.program}: judged once on the {len(dev)} dev items, reused by every trial")
    # The search's stated price is its --model's: it prices the first stage only when that runs on the same spec.
    price = plan.lm.price_per_mtok if stage.model == plan.lm.model else None
    lm = dataclasses.replace(plan.lm, price_per_mtok=price, referee_models=(), batch=False, batch_dir=None)
    run = judge_first_stage(stage, dev, Path("results") / spec.name / "first-stage", fitted_on=header, lm=lm,
                            concurrency=concurrency)
    return SearchedCascade(run, cascade.level, cascade.risk, header={**header, "first_stage_model": run.model})


def parent_run(opened: optuna.Study, spec: StudySpec, recorded: dict, base: DebateConfig, tracking, data):
    """The study's MLflow parent run, shared by its workers, with how ``data``'s labels were read (``data.<flag>``,
    as ``chateval evaluate`` logs them); the trial runs of its killed workers (on this host) end as KILLED first."""
    from optim.tracking import runs as mlflow_tracking

    mlflow_tracking.end_dead_runs({"optuna.study": spec.name}, tracking.uri)
    params = {"study": spec.name, "storage": studies.storage_label(spec.storage), **recorded, "data": data.reading()}
    if base.task is not None:  # MLflow keeps 6,000 characters a param: the task's compact form
        params["base"] = {**recorded["base"], "task": base.task.params()}
    return studies.study_run(opened, params=params, uri=tracking.uri)


def slot_config(base: DebateConfig, space: SearchSpace) -> DebateConfig:
    """The panel the LM is laid out for, once for every trial: parallel referees only when every trial has them
    (on a small CPU, servers split for parallel requests run a one-by-one trial on a fraction of the cores)."""
    return base.replace(roles=tuple(f"referee_{i + 1}" for i in range(space.n_roles[1])),
                        strategy="one_by_one" if "one_by_one" in space.strategies else "simultaneous_talk")


def tested_best(opened: optuna.Study, trial, data, plan: SearchPlan, *, model: str, referees: dict, concurrency: int,
              hooks: SearchHooks):
    """The chosen trial's panel judged on the test split (resuming its file) and told to ``hooks``; with the
    referees' models of that panel's own referees."""
    with hooks.progress(len(plan.parts["test"])) as on_item:
        tested = final_test(opened, trial, plan.parts, plan.out, settings=plan.settings, seed=data.seed,
                            n_resamples=data.resamples, concurrency=concurrency, on_item=on_item)
    cfg = tested.program.config
    referees = {k: v for k, v in referees.items() if k in cfg.roles}  # the best panel's own
    hooks.tested(tested.trial, tested.result, tested.figures,
                 run_header(data, cfg, model, tested.result.n, "test", referee_models=referees))
    return tested, referees


def search_card(data, plan: SearchPlan, spec: StudySpec, space: SearchSpace, recorded: dict, tested,
                finished: int) -> dict:
    """What the saved evaluator's card says of the data, the split and the search that chose it (a figure that is
    not finite, a cascade that reached no threshold, as None: JSON has no infinity)."""
    values = [v if math.isfinite(v) else None for v in tested.trial.values]
    cascade = ({"cascade": {**recorded["cascade"], "dev": tested.trial.user_attrs.get("cascade"),
                            "note": IN_SAMPLE_NOTE}} if "cascade" in recorded else {})
    return {
        "dataset": data.dataset, "dataset_hash": recorded["dataset_hash"],
        "split": split_record(data.seed, data.limit, plan.parts),
        "search": {"study": spec.name, "storage": studies.storage_label(spec.storage),
                   "trial": tested.trial.number, "objectives": list(spec.objectives),
                   "trials_finished": finished, "space": space.to_dict(), "values": values, **cascade},
        **({"skipped_rows": skipped_rows(plan.items.skipped)} if getattr(plan.items, "skipped", None) else {})}


def objective_for(data, plan: SearchPlan, spec: StudySpec, space: SearchSpace, *, concurrency: int, track: bool,
                  hooks: SearchHooks, cascade=None) -> Objective:
    """One trial of the study: a panel drawn from ``space``, judged (and compiled) on the dev split; with
    ``cascade`` (``cascade_cost``), the first stage is judged on the dev split first (``first_stage``)."""
    searched = first_stage(data, plan, spec, cascade, concurrency=concurrency, hooks=hooks) if cascade else None
    return Objective(space=space, base=plan.base, parts=plan.parts, objectives=spec.objectives, n_trials=spec.trials,
                     seed=data.seed, n_resamples=data.resamples, settings=plan.settings, report_every=spec.report_every,
                     concurrency=concurrency, results_dir=Path("results") / spec.name, track=track, on_item=hooks.item,
                     cascade=searched)


def trials(opened: optuna.Study, objective: Objective, spec: StudySpec, *, wait: bool, poll: float,
           hooks: SearchHooks, tracking=None) -> tuple[list[int], int]:
    """This worker's trials run (waiting for the other workers' when it tests): ``(trials it ran, finished in the
    study)``. With ``tracking`` enabled, the MLflow run of any trial failed meanwhile (a killed worker's) is ended."""
    tracked = tracking is not None and tracking.enabled
    ran = studies.run_trials(opened, objective, spec.trials, callbacks=[hooks.trial], wait=wait, poll=poll,
                             on_wait=hooks.waiting, on_failed=partial(studies.end_failed_trial_runs, uri=tracking.uri)
                             if tracked else None)
    finished = studies.count(opened)
    hooks.trials_done(opened, ran, finished)
    return ran, finished


def run_search(data, base: DebateConfig | Callable[[str], DebateConfig], lm, *, study: StudySpec,
               space: SearchSpace | None = None, settings: OptimizerSettings | None = None,
               out: str | Path | None = None, test: bool = True, tracking=None, concurrency: int = 1,
               hooks: SearchHooks | None = None, poll: float = 1.0, cascade=None, gates=None) -> SearchRun:
    """Run ``study``'s trials over ``space`` on ``data``'s dev split, then test and save the best panel.

    ``base`` is what trials do not choose, or a function of the dataset's format; with a cost objective ``lm``'s cache
    is turned off, and a mixed panel's ``referee_models`` apply to the trials that seat those referees. ``test``
    False runs trials only, leaving the test and save to a worker that tests (``poll``: seconds between looks at
    other workers' trials). ``gates`` as for ``save_gated``; ``cascade``: for ``cascade_cost``, the first stage,
    level and risk (``first_stage``).
    """
    from chateval_dspy.lm.panel import referee_names

    hooks, space, spec = hooks or SearchHooks(), space or SearchSpace(), study
    plan = plan_search(data, base, lm, spec=spec, settings=settings, out=out, test=test, concurrency=concurrency,
                       hooks=hooks, cascade=cascade, gates=gates)
    opened = studies.open_study(spec.name, spec.storage, spec.objectives, seed=data.seed, prune=spec.prune,
                                warmup_steps=2 * spec.report_every)
    recorded = study_settings(data, plan, spec, space, cascade)
    studies.check_settings(opened, recorded)  # a study run with other settings is refused
    hooks.started(opened, spec, plan.parts)
    tracked = tracking is not None and tracking.enabled
    objective = objective_for(data, plan, spec, space, concurrency=concurrency, track=tracked, hooks=hooks,
                              cascade=cascade)
    mlflow_tracking = importlib.import_module("optim.tracking.runs") if tracked else None
    tested = card = None
    with parent_run(opened, spec, recorded, plan.base, tracking, data) if tracked else contextlib.nullcontext() as active:
        with plan.lm.judging(lm_slots(slot_config(plan.base, space), concurrency)) as judging_lm:
            model, referees = judging_lm.model, referee_names()
            if tracked:
                mlflow_tracking.log_params({"model": model, **({"referee_models": referees} if referees else {})})
            ran, finished = trials(opened, objective, spec, wait=test, poll=poll, hooks=hooks, tracking=tracking)
            final = choose_final(opened, plan.out, test=test)
            if final.trial is None:
                hooks.final(final.reason)
            else:
                tested, referees = tested_best(opened, final.trial, data, plan, model=model, referees=referees,
                                             concurrency=concurrency, hooks=hooks)
        _trials_table(opened, spec, mlflow_tracking, finished)
        if tested is not None:
            card = save_final(opened, tested, plan.out, model=model, referee_models=referees, tracking=tracking,
                              gates=gates, lm=plan.lm, seed=data.seed, concurrency=concurrency,
                              card=search_card(data, plan, spec, space, recorded, tested, finished))
    return SearchRun(opened, ran, finished, plan.out, saved=card is not None, card=card,
                     mlflow_run_id=active.info.run_id if tracked else None)


def objective_columns(study: optuna.Study, objectives) -> dict[str, list[float]]:
    """The columns ``trials.csv`` adds for the objectives beyond agreement, one value per trial in the study's order
    (NaN for a trial without one: pruned, failed, running; a cascade that reached no level stays ``inf``):
    ``cascade_usd_per_1000``, ``robustness``.

    Example:
        >>> study = optuna.create_study(directions=["maximize", "maximize"])
        >>> study.add_trial(optuna.trial.create_trial(values=[0.8, 0.75]))
        >>> objective_columns(study, ("agreement", "robustness"))
        {'robustness': [0.75]}
    """
    names = {"cascade_cost": "cascade_usd_per_1000", "robustness": "robustness"}
    trials = study.get_trials(deepcopy=False)
    return {names[o]: [t.values[i] if t.values else math.nan for t in trials]
            for i, o in enumerate(objectives) if o in names}


def _trials_table(study: optuna.Study, spec: StudySpec, mlflow_tracking, finished: int) -> None:
    from optim.tracking.report import trials_frame

    table = Path("results") / spec.name / "trials.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    frame = trials_frame(study)
    if not frame.empty:
        at = frame.columns.get_loc("tokens_per_item") + 1
        for offset, (column, values) in enumerate(objective_columns(study, spec.objectives).items()):
            frame.insert(at + offset, column, values)
    frame.to_csv(table, index=False)
    if mlflow_tracking is not None:
        mlflow_tracking.log_metrics({"trials_finished": finished})
        mlflow_tracking.log_file(table, "search")
