"""Compile an evaluator against human labels with DSPy's own optimizers, and ``chateval compile`` as a function.

Every role's ``argue``/``judge`` predictor (and the summarizer) is a separate tunable unit, so each optimizer tunes
all referees' instructions and demonstrations together; ``compile_and_save`` reports the held-out test split.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dspy

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.splits import dataset_hash, split_record
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.program.demos import with_label_demos
from optim.tracking import models as mlflow_model
from optim.tuning.labels import LabelledData
from optim.tuning.objectives import METRICS, Metric, make_metric, with_feedback
from optim.tuning.settings import OPTIMIZERS, OptimizerSettings


def compile_evaluator(student: ChatEval, *, optimizer: str, trainset: Sequence[dspy.Example],
                      valset: Sequence[dspy.Example] | None, metric: Metric,
                      settings: OptimizerSettings = OptimizerSettings(),
                      reflection_lm: dspy.LM | None = None) -> ChatEval:
    """Tune ``student`` (left unchanged) on ``trainset``, selecting on ``valset`` (optimizers that select), and
    return the compiled copy. ``reflection_lm``: GEPA's reflection model (default the LM in the current context).
    """
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
    if not trainset:
        raise ConfigError("compiling needs a non-empty train split")
    trainset, valset = list(trainset), list(valset or [])
    s = settings
    if optimizer == "labeled":
        return with_label_demos(student, trainset, k=s.max_demos)
    if optimizer == "bootstrap":
        opt = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=s.max_demos, max_labeled_demos=0)
        return opt.compile(student, trainset=trainset)
    if optimizer == "bootstrap_rs":
        opt = dspy.BootstrapFewShotWithRandomSearch(metric=metric, max_bootstrapped_demos=s.max_demos,
                                                    max_labeled_demos=0, num_candidate_programs=s.candidates,
                                                    num_threads=s.threads)
        return opt.compile(student, trainset=trainset, valset=valset or None)
    if optimizer == "mipro":
        opt = dspy.MIPROv2(metric=metric, auto=s.auto, max_bootstrapped_demos=s.max_demos, max_labeled_demos=0,
                           num_threads=s.threads, seed=s.seed)
        return opt.compile(student, trainset=trainset, valset=valset or None, requires_permission_to_run=False)
    if optimizer == "gepa":
        opt = dspy.GEPA(metric=with_feedback(metric, student.config.task_spec), auto=s.auto, num_threads=s.threads, seed=s.seed,
                        reflection_lm=reflection_lm or dspy.settings.lm, track_stats=True)
        return opt.compile(student, trainset=trainset, valset=valset or None)
    # SIMBA asserts that the batch fits in the train set.
    opt = dspy.SIMBA(metric=metric, bsize=min(32, len(trainset)), num_candidates=s.candidates,
                     max_steps=s.candidates, max_demos=s.max_demos, num_threads=s.threads)
    return opt.compile(student, trainset=trainset, seed=s.seed)


def optimizer_progress(program) -> list[tuple[int, float]]:
    """The dev scores the optimizer recorded on the program it returned, as ``(step, score)``: MIPROv2's full
    evaluations by trial number; GEPA's candidates in the order proposed; random search's and SIMBA's candidates,
    best first (SIMBA scores on the train set); none for labeled and bootstrap."""
    logs = getattr(program, "trial_logs", None)
    if isinstance(logs, dict):  # SIMBA's trial logs hold train scores only; its candidates follow below
        full = [(int(t), float(v["full_eval_score"])) for t, v in sorted(logs.items())
                if isinstance(v, dict) and v.get("full_eval_score") is not None]
        if full:
            return full
    scores = getattr(getattr(program, "detailed_results", None), "val_aggregate_scores", None)
    if scores:
        return [(i, float(x)) for i, x in enumerate(scores)]
    candidates = getattr(program, "candidate_programs", None) or []
    return [(i, float(c["score"])) for i, c in enumerate(candidates) if isinstance(c, dict) and c.get("score") is not None]


class CompileHooks:
    """What ``compile_and_save`` tells its caller as it goes; the CLI prints it, the defaults stay silent."""

    def progress(self, stage: str, total: int) -> contextlib.AbstractContextManager:
        """A context yielding the per-item callback for one test stage (``before``/``after``), or None."""
        return contextlib.nullcontext()

    def compiling(self, optimizer: str, n_train: int, n_dev: int) -> None:
        """The optimizer starts (it is skipped when a killed run already kept its program)."""

    def optimized(self, optimizer: str, metric: str, dev_scores: list[tuple[int, float]]) -> None:
        """The compiled program is there; ``dev_scores`` is ``optimizer_progress`` of it (may be empty)."""

    def tested(self, stage: str, result, figures: dict, header: dict) -> None:
        """One test stage's ``RunResult``, its metrics with CIs, and the header that states what was judged."""


@dataclass
class CompileRun:
    """What ``compile_and_save`` made: the program, its card and folder, and the MLflow run that holds them."""

    program: ChatEval
    card: dict
    out: Path
    model: str
    mlflow_run_id: str | None = None


class CompileFolder:
    """The output folder's own record of the compile that fills it (``results/compile.json``): which compile, the
    compiled program and the optimizer's progress once it returns, and whether all is done. A rerun after a kill does
    only what is left; a finished folder or another compile's is refused.
    """

    def __init__(self, out: Path):
        self.out, self.work = out, out / "results"
        self.path, self.program_path = self.work / "compile.json", self.work / "compiled.json"

    def state(self) -> dict:
        return json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}

    def claim(self, key: str, what: dict) -> dict:
        """Bind the folder to this compile (or find it bound already); ConfigError for anything else."""
        what = json.loads(json.dumps(what, default=str))  # as it reads back from the file
        state = self.state()
        if state.get("done") or (not state and (self.out / "card.json").exists()):
            raise ConfigError(f"{self.out} already holds a compiled evaluator; choose another --out")
        if state and state.get("key") != key:
            theirs = state.get("what", {})
            diff = ", ".join(f"{k}: {theirs.get(k)!r} there, {v!r} now" for k, v in what.items() if theirs.get(k) != v)
            raise ConfigError(f"{self.out} holds an unfinished compile of another kind ({diff or 'other data or LM'}); "
                              "rerun that command to finish it, or choose another --out")
        if not state:
            state = {"key": key, "what": what, "done": False}
            self._write(state)
        return state

    def update(self, **changes) -> None:
        self._write({**self.state(), **changes})

    def _write(self, state: dict) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(state, indent=2, default=str), encoding="utf-8")
        os.replace(tmp, self.path)

    def compiled(self, student: ChatEval) -> ChatEval | None:
        """The compiled program a killed run kept, or None."""
        if not self.program_path.exists():
            return None
        program = student.deepcopy()
        program.load(str(self.program_path), allow_pickle=False)
        return program

    def keep(self, program: ChatEval, dev_scores: list) -> None:
        # Written beside and renamed over: a kill leaves no program or a whole one, never half of one.
        self.update(dev_scores=dev_scores)  # first: a kept program always finds its progress beside it
        tmp = self.program_path.with_name(".compiled.tmp.json")
        program.save(str(tmp))
        os.replace(tmp, self.program_path)


@dataclass
class CompilePlan:
    """What a compile judges and learns from, checked before any LM starts or any file is written."""

    items: list
    config: DebateConfig
    parts: dict
    metric_name: str
    metric: Metric
    skipped: list


def plan_compile(data, config, lm, *, optimizer: str, metric: str | None, concurrency: int) -> CompilePlan:
    """The items, panel, split and metric of a compile; ConfigError for anything it cannot run."""
    from chateval_dspy.run.evaluate_dataset import check_task, skipped_rows

    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
    if concurrency < 1:
        raise ConfigError(f"concurrency must be positive, got {concurrency}")
    items, fmt = data.load()
    cfg = config(fmt) if callable(config) else config
    check_task(data, cfg)
    lm.check_panel(cfg.roles)  # a mixed panel's referees must sit on it: checked before any model starts
    parts = data.parts(items)
    if not parts["train"] or not parts["test"]:
        raise ConfigError("the train or test split is empty: use more items or a larger --limit")
    metric_name = metric or METRICS[fmt][0]
    return CompilePlan(items, cfg, parts, metric_name, make_metric(metric_name, cfg.task_spec, parts["train"]),
                       skipped_rows(getattr(items, "skipped", [])))


@dataclass
class CompileJob:
    """One ``compile_and_save`` call's steps over its plan: the MLflow run, the two test stages, the card.
    ``mlflow`` is ``optim.tracking.runs`` when ``tracking`` is enabled, else None (nothing goes to MLflow)."""

    data: object
    plan: CompilePlan
    lm: object
    optimizer: str
    settings: OptimizerSettings
    out: Path
    hooks: CompileHooks
    concurrency: int
    tracking: object = None
    mlflow: object = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.folder = CompileFolder(self.out)
        if self.tracking is not None and self.tracking.enabled:
            from optim.tracking import runs as mlflow_tracking

            self.mlflow = mlflow_tracking
            # A killed compile of this folder left its MLflow run (and the optimizer's child runs) RUNNING.
            mlflow_tracking.end_dead_runs({"chateval.out": str(self.out.resolve())}, self.tracking.uri)

    def claim(self) -> None:
        """Bind the output folder to this compile: its data, panel, LM, optimizer, settings and metric, and the
        items' contents whatever the file names (another compile finding it is told the difference)."""
        from chateval_dspy.run import identity

        data, plan = self.data, self.plan
        what = {"dataset": data.dataset, "seed": data.seed, "limit": data.limit, "config": plan.config.changes(),
                "lm": self.lm.identity(), "optimizer": self.optimizer, "settings": self.settings.to_dict(),
                "metric": plan.metric_name}
        self.folder.claim(identity.digest({**what, "dataset_hash": dataset_hash(plan.items)}), what)

    def runs(self) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        """The compile's MLflow run and the autologging of the optimizer's runs (no-ops when untracked)."""
        from optim.tracking.evaluation import run_params

        if self.mlflow is None:
            return contextlib.nullcontext(), contextlib.nullcontext()
        plan, parts = self.plan, self.plan.parts
        params = run_params(self.data, plan.config, "", plan.items, optimizer=self.optimizer,
                            optimizer_settings=self.settings.to_dict(), metric=plan.metric_name,
                            n_train=len(parts["train"]), n_dev=len(parts["dev"]), n_test=len(parts["test"]))
        params.pop("model")  # known once the LM is up: logged then (with a mixed panel's referee models)
        run = self.mlflow.run("compile", params=params, uri=self.tracking.uri,
                              tags={"command": "compile", "optimizer": self.optimizer,
                                    "chateval.out": str(self.out.resolve())})
        return run, self.mlflow.autolog_compiles()

    def compiled(self, student: ChatEval) -> ChatEval:
        """The compiled program (kept by a killed run, or compiled now and kept), its progress told and logged."""
        compiled, parts = self.folder.compiled(student), self.plan.parts
        if compiled is not None:
            dev_scores = [tuple(x) for x in self.folder.state().get("dev_scores") or []]
        else:
            self.hooks.compiling(self.optimizer, len(parts["train"]), len(parts["dev"]))
            compiled = compile_evaluator(student, optimizer=self.optimizer, trainset=parts["train"], valset=parts["dev"],
                                         metric=self.plan.metric, settings=self.settings)
            dev_scores = optimizer_progress(compiled)
            self.folder.keep(compiled, dev_scores)
        self.hooks.optimized(self.optimizer, self.plan.metric_name, dev_scores)
        if self.mlflow is not None:
            for step, value in dev_scores:
                self.mlflow.log_metrics({"optimizer.dev_score": value}, step=step)
        return compiled

    def test(self, stage: str, program: ChatEval, model: str, referees) -> tuple[dict, dict]:
        """One test stage (``before``/``after``) judged (resuming its file): its figures and cost, told and logged."""
        from chateval_dspy.run import identity
        from chateval_dspy.run.evaluate import evaluate
        from chateval_dspy.run.evaluate_dataset import run_header
        from optim.tracking.evaluation import unpriced_marks

        cfg, test = self.plan.config, self.plan.parts["test"]
        stage_key = identity.run_key(cfg, self.lm.identity(), test, program.dump_state())
        with self.hooks.progress(stage, len(test)) as on_item:
            result = evaluate(program, test, cfg, out=self.folder.work / f"test_{stage}.jsonl",
                              concurrency=self.concurrency, on_item=on_item, run_key=stage_key)
        figures, cost = result.metrics(seed=self.data.seed, n_resamples=self.data.resamples), result.card_cost()
        self.hooks.tested(stage, result, figures, run_header(self.data, cfg, model, result.n, "test",
                                                             referee_models=referees))
        if self.mlflow is not None:
            self.mlflow.log_metrics(figures, {**cost, **result.model_metrics()}, prefix=f"test_{stage}.")
            self.mlflow.log_params(unpriced_marks(cost, prefix=f"test_{stage}."))
        return figures, cost

    def card(self, compiled: ChatEval, model: str, referees, figures: dict, costs: dict) -> dict:
        """The saved evaluator's card: its model, data and split, optimizer, test figures and cost (and labels)."""
        from chateval_dspy.deploy.saved.card import make_card
        from chateval_dspy.run.metrics import plain

        data, plan = self.data, self.plan
        return make_card(compiled, model=model, referee_models=referees, dataset=data.dataset,
                         dataset_hash=dataset_hash(plan.items),
                         split=split_record(data.seed, data.limit, plan.parts),
                         optimizer=self.optimizer, optimizer_settings=self.settings.to_dict(),
                         metric=plan.metric_name, test_metrics={s: plain(figures[s]) for s in figures},
                         cost=costs["after"],
                         **({"skipped_rows": plan.skipped} if plan.skipped else {}),
                         **({"labels": data.label_set().card()} if isinstance(data, LabelledData) else {}))


def save_gated(program: ChatEval, out: Path, card: dict, *, held_out: tuple[list, Path, str], seed: int, gates, lm,
               concurrency: int, tracking) -> dict:
    """``program`` saved to ``out`` with ``card``; what its ``gates`` read measured on the held-out items (``(items,
    their results file, dataset)``) into the card and checked (``GateRefused``: nothing is logged or registered);
    then, with ``tracking`` enabled, logged to the active MLflow run with its certificate, its models registered if
    asked. Returns the card written."""
    from chateval_dspy.deploy.saved.store import save_program
    from optim.certify.certificate import log_certificate
    from optim.certify.measure import HeldOut, held_out_name, measure_and_enforce

    save_program(program, out, card)
    items, results, dataset = held_out
    card, certificate = measure_and_enforce(out, program, gates, lm=lm, seed=seed, concurrency=concurrency,
                                            held_out=HeldOut(items, results, held_out_name(dataset, seed, len(items))))
    if tracking is not None and tracking.enabled:
        from optim.tracking import runs

        if certificate is not None:
            log_certificate(certificate, out)
        runs.log_file(out, "evaluator")
        if tracking.log_model:  # outside the LM context: no client or key travels with it
            mlflow_model.log_models(program, out, registered_name=tracking.register, wheelhouse=tracking.wheelhouse)
    return card


def compile_and_save(data, config, lm, *, optimizer: str, out: str | Path, metric: str | None = None,
                     settings: OptimizerSettings = OptimizerSettings(), tracking=None, concurrency: int = 1,
                     hooks: CompileHooks | None = None, gates=None) -> CompileRun:
    """Judge the test split, compile on train (selecting on dev), judge test again, save, and log to MLflow.

    Rerunning the same call after a kill finishes the job: the test results resume from their files, a compiled
    program kept before the kill is reused, and the card, MLflow logging and registration are done if they were not;
    the killed run's MLflow runs end as KILLED. ``data`` is a ``DataSpec`` or a ``LabelledData`` (people's labels on
    top, recorded under the card's ``labels``); ``config`` a panel or a function of the dataset's format; ``metric``
    ``agreement`` or ``balanced`` (pairwise), ``score_error`` (pointwise), default the first; ``tracking`` a
    ``TrackingSpec`` (None or disabled: nothing goes to MLflow); ``gates`` as for ``save_gated``.
    """
    from chateval_dspy.lm.panel import referee_names
    from chateval_dspy.run.evaluate_dataset import lm_slots
    from optim.certify.measure import check_gate_data

    plan = plan_compile(data, config, lm, optimizer=optimizer, metric=metric, concurrency=concurrency)
    check_gate_data(gates, plan.config.format, [x.id for x in plan.parts["test"]])
    job = CompileJob(data, plan, lm, optimizer, settings, Path(out), hooks or CompileHooks(), concurrency, tracking)
    job.claim()
    student = build_evaluator(plan.config)
    figures, costs = {}, {}
    run, autolog = job.runs()
    with run as active, autolog:
        with lm.judging(lm_slots(plan.config, max(concurrency, settings.threads))) as judging_lm:
            model, referees = judging_lm.model, referee_names()
            if job.mlflow is not None:
                job.mlflow.log_params({"model": model, **({"referee_models": referees} if referees else {})})
            figures["before"], costs["before"] = job.test("before", student, model, referees)
            compiled = job.compiled(student)
            figures["after"], costs["after"] = job.test("after", compiled, model, referees)
        held_out = (plan.parts["test"], job.folder.work / "test_after.jsonl", data.dataset)
        card = save_gated(compiled, job.out, job.card(compiled, model, referees, figures, costs), held_out=held_out,
                          seed=data.seed, gates=gates, lm=lm, concurrency=concurrency, tracking=tracking)
        # Done once everything is logged: a kill before this line leaves a folder the rerun completes.
        run_id = active.info.run_id if job.mlflow is not None else None
        job.folder.update(done=True, mlflow_run_id=run_id)
    return CompileRun(compiled, card, job.out, model, run_id)

