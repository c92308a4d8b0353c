"""One search trial: suggest a panel, build (and maybe compile) it, judge the dev split in chunks.

Dev results stream to ``trial-NNNN-dev.jsonl``. Trials are seeded by their place in the study (``slot``), not their
number, so a trial that retries one whose worker died draws the same panel and resumes its results file.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dspy
import optuna
from optuna.trial import FrozenTrial, TrialState

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.run import identity, records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.metrics import plain, primary_metric
from chateval_dspy.run.result import RunResult
from optim.search.space import SearchSpace, suggest_config
from optim.search.study import FINISHED, SurplusTrial, make_sampler
from optim.search.worker import Worker
from optim.tracking.evaluation import config_params
from optim.tuning.cascade import IN_SAMPLE_NOTE, SearchedCascade
from optim.tuning.compile import OptimizerSettings, compile_evaluator
from optim.tuning.objectives import make_metric


def running_agreement(result: RunResult) -> float:
    """The task's primary metric without bootstrap (``optim.ablation.paired.agreement_statistic``), for pruning after
    each chunk of dev items; a scored item without a verdict is left out."""
    from optim.ablation.paired import agreement_statistic

    if not result.human:
        return math.nan
    pairwise = result.config.format == "pairwise"
    kept = [(h, p) for h, p in zip(result.human, result.predicted) if pairwise or p is not None]
    return agreement_statistic(result.config.task_spec)([h for h, _ in kept], [p for _, p in kept])


def build_for_trial(config: DebateConfig, compile_choice: str, trainset: Sequence, settings: OptimizerSettings) -> ChatEval:
    """``build_evaluator(config)``, compiled on ``trainset`` when the trial chose to compile."""
    program = build_evaluator(config)
    if compile_choice == "none":
        return program
    if not trainset:
        raise ConfigError("compiling needs a non-empty train split: use more items or a larger --limit")
    return compile_evaluator(program, optimizer=compile_choice, trainset=trainset, valset=None,
                             metric=make_metric(None, config.task_spec, trainset),
                             settings=settings)


def config_of(trial: FrozenTrial) -> tuple[DebateConfig, str]:
    """The config and compile choice a finished trial recorded."""
    return DebateConfig.from_dict(trial.user_attrs["config"]), trial.user_attrs.get("compile", "none")


def slot(trial: optuna.Trial) -> int:
    """The trial's place in the study's budget: trials before it that did not fail. A failed trial gives its place
    to the next, which then draws the same panel (seeding by number, which only grows, would draw a new one)."""
    return sum(1 for t in trial.study.get_trials(deepcopy=False)
               if t.number < trial.number and t.state != TrialState.FAIL)


@dataclass
class Objective:
    """One trial: suggest a panel, build (and maybe compile) it, judge the dev split in chunks.

    Returns dev agreement, then per ``objectives`` tokens per dev item or the cascade's USD per 1,000 verdicts
    (``cascade.cost_of``: in-sample; ``math.inf`` where no stage reaches the level), then the mean robustness rate
    (the bias audit's text probes). An undefined agreement (pointwise: a constant column has no Spearman) or robustness counts
    as 0.0 and marks the trial ``agreement_undefined`` / ``robustness_undefined``: failing the trial instead would
    hide it from the sampler and never count toward ``--trials``.
    A trial started past ``n_trials`` (a race between workers) stops; pruning may stop one after any chunk of
    ``report_every`` dev items but the last; ``results_dir`` holds each trial's ``trial-0007-dev.jsonl``; ``track``
    logs each trial as a nested MLflow run under the study's.
    """

    space: SearchSpace
    base: DebateConfig
    parts: dict
    objectives: tuple[str, ...] = ("agreement",)
    n_trials: int | None = None
    seed: int = 0
    n_resamples: int | None = None
    settings: OptimizerSettings = field(default_factory=OptimizerSettings)
    report_every: int = 4
    concurrency: int = 1
    results_dir: Path | None = None
    track: bool = False
    on_item: Callable[[dict], None] | None = None
    cascade: SearchedCascade | None = None
    last: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if ("cascade_cost" in self.objectives) != (self.cascade is not None):
            raise ConfigError("the cascade_cost objective and a first stage go together: give both or neither")

    def __call__(self, trial: optuna.Trial):
        # First of all, so that a rerun can tell this trial's worker died should it be killed from here on.
        trial.set_user_attr("worker", Worker.current().tag())
        self.last = trial.number
        if self.n_trials is not None:
            ahead = [t for t in trial.study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
                     if t.number < trial.number]
            if len(ahead) >= self.n_trials:
                trial.set_user_attr("surplus", True)
                raise SurplusTrial(f"the study already holds {len(ahead)} trials; this worker stops")
        trial.study.sampler = make_sampler(self.seed, slot(trial))
        config, compile_choice = suggest_config(trial, self.space, self.base)
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("compile", compile_choice)
        # A finished trial with the very same parameters: its figures are reused, nothing is judged twice.
        same = next((t for t in trial.study.get_trials(deepcopy=False, states=FINISHED)
                     if t.number != trial.number and t.params == trial.params), None)
        if not self.track:
            return self._reuse(trial, same) if same else self._run(trial, config, compile_choice)
        from optim.tracking import runs as tracking

        tags = {"optuna.study": trial.study.study_name, "optuna.trial": str(trial.number),
                **({"duplicate_of": str(same.number)} if same else {})}
        pruned = values = None
        with tracking.run(f"trial-{trial.number}", nested=True, tags=tags,
                          params={"trial": trial.number, "config": config_params(config), "compile": compile_choice}) as active:
            trial.set_user_attr("mlflow_run_id", active.info.run_id)
            try:
                values = self._reuse(trial, same) if same else self._run(trial, config, compile_choice, tracking)
            except optuna.TrialPruned as exc:  # the MLflow run still ends as FINISHED, with what was measured
                pruned = exc
                tracking.log_metrics({"pruned": 1.0})
            if same and values is not None:
                tracking.log_metrics(objective_metrics(self.objectives, values))
            elif self.results_dir and trial.user_attrs.get("results"):
                tracking.log_file(trial.user_attrs["results"], "results")
        if pruned is not None:
            raise pruned
        return values

    def _reuse(self, trial: optuna.Trial, same: FrozenTrial):
        trial.set_user_attr("duplicate_of", same.user_attrs.get("duplicate_of", same.number))
        for key in ("dev", "cost", "agreement_undefined", "results", "cascade", "robustness", "robustness_undefined"):
            if key in same.user_attrs:
                trial.set_user_attr(key, same.user_attrs[key])
        if same.state == TrialState.PRUNED:
            raise optuna.TrialPruned(f"same parameters as pruned trial {same.number}")
        return same.values[0] if len(same.values) == 1 else tuple(same.values)

    def _results_file(self, trial: optuna.Trial, key: str) -> Path | None:
        """The trial's dev results file, started from what a failed trial with the same panel left, if any."""
        if not self.results_dir:
            return None
        out = Path(self.results_dir) / f"trial-{trial.number:04d}-dev.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("", encoding="utf-8")  # a stale file of a deleted study of the same name is no part of this one
        for t in reversed(trial.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))):
            earlier = Path(t.user_attrs.get("results") or "")
            if t.params != trial.params or not earlier.is_file() or earlier == out:
                continue
            try:
                records.finished_records(earlier, key)
            except ValueError:  # another run's file (ConfigError) or a damaged one (DataError): start afresh
                continue
            shutil.copyfile(earlier, out)  # a copy: killed again here, the earlier file is still whole
            trial.set_user_attr("resumed_from", t.number)
            break
        trial.set_user_attr("results", str(out))
        return out

    def _run(self, trial: optuna.Trial, config: DebateConfig, compile_choice: str, tracking=None):
        program = build_for_trial(config, compile_choice, self.parts["train"], self.settings)
        dev = self.parts["dev"]
        # One key for the whole dev split: each chunk appends to the same file, which a retry then resumes.
        key = identity.run_key(config, identity.context_identity(), dev, program.dump_state())
        out = self._results_file(trial, key)
        stream = records.ResultsStream(out, key)  # out None: nothing to resume
        result, lines, done = RunResult(config), list(stream.records), set(stream.done)  # lines: what a cascade routes
        for record in lines:
            result.add(record)

        def judged(record: dict) -> None:
            result.add(record)
            lines.append(record)
            if self.on_item:
                self.on_item(record)

        prune = len(self.objectives) == 1
        step = max(1, self.report_every)
        for start in range(0, len(dev), step):
            chunk = [x for x in dev[start:start + step] if str(x.id) not in done]
            if not chunk:
                continue
            judged_before = result.n
            ran = evaluate(program, chunk, config, out=out, concurrency=self.concurrency, on_item=judged, run_key=key)
            result.wall_seconds += ran.wall_seconds
            value = running_agreement(result)
            if prune and not math.isnan(value) and result.n > judged_before:
                trial.report(value, step=result.n)
                if tracking:
                    tracking.log_metrics({"dev.running_agreement": value}, step=result.n)
                if start + step < len(dev) and trial.should_prune():
                    trial.set_user_attr("cost", result.cost())
                    raise optuna.TrialPruned(f"dev agreement {value:.3f} after {result.n} of {len(dev)} items")
        metrics, cost = result.metrics(seed=self.seed, n_resamples=self.n_resamples), result.cost()
        agreement = float(metrics[primary_metric(config.task_spec)].value) if metrics else math.nan
        undefined = math.isnan(agreement)
        trial.set_user_attr("dev", plain(metrics))
        trial.set_user_attr("cost", cost)
        trial.set_user_attr("agreement_undefined", undefined)
        values = [0.0 if undefined else agreement]
        if "tokens" in self.objectives:
            values.append(cost["prompt_tokens_per_item"] + cost["completion_tokens_per_item"])
        if "cascade_cost" in self.objectives:
            values.append(self._cascade_cost(trial, lines, config, out, tracking))
        if "robustness" in self.objectives:
            values.append(self._robustness(trial, program, tracking))
        if tracking:
            tracking.log_metrics(metrics, cost, prefix="dev.")
            tracking.log_metrics({**objective_metrics(self.objectives, values), "agreement_undefined": float(undefined)})
        return values[0] if len(values) == 1 else tuple(values)

    def _cascade_cost(self, trial: optuna.Trial, lines: list[dict], config: DebateConfig, out: Path | None,
                      tracking=None) -> float:
        """The cascade [first stage -> this panel]'s USD per 1,000 verdicts on the dev items (in-sample), recorded
        on the trial and its MLflow run."""
        model = getattr(dspy.settings.lm, "model", None) or "?"
        figure = self.cascade.cost_of(lines, self.parts["dev"], config.task_spec, model=model, results=out,
                                      seed=self.seed)
        trial.set_user_attr("cascade", figure.to_dict())
        if tracking:
            tracking.log_metrics(figure.metrics(), prefix="dev.cascade.")
            tracking.log_params({"cascade.in_sample": IN_SAMPLE_NOTE})
        return figure.usd_per_1000

    def _robustness(self, trial: optuna.Trial, program: ChatEval, tracking=None) -> float:
        """The mean robustness rate of this panel under the bias audit's text probes that apply
        (``optim.audit.probes.ROBUSTNESS_PROBES``) on the dev items, on the LM of the current DSPy context, recorded on
        the trial (each probe's rate with its interval) and its MLflow run; undefined counts as 0.0. The audit judges
        the unperturbed items again, then each perturbation: five passes over the items for a pairwise panel."""
        from chateval_dspy.deploy.saved.judge import Judge
        from optim.audit.perturb import applies
        from optim.audit.probes import ROBUSTNESS_PROBES, audit

        lm, dev = dspy.settings.lm, self.parts["dev"]
        judge = Judge(program, {"model": getattr(lm, "model", None)}, lm, contextlib.ExitStack())
        probes = tuple(p for p in ROBUSTNESS_PROBES if applies(p, program.config.format))
        with contextlib.ExitStack() as stack:
            folder = (Path(self.results_dir) / f"trial-{trial.number:04d}-audit" if self.results_dir
                      else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trial-audit-"))))
            report = audit(judge, dev, out=folder, probes=probes, seed=self.seed, concurrency=self.concurrency,
                           data=f"dev split, {len(dev)} items")
        mean = report.mean_robustness()
        undefined = math.isnan(mean)
        trial.set_user_attr("robustness", {"mean": None if undefined else mean, "data": report.data,
                                           "probes": {p: e.to_dict() for p, e in report.robustness().items()}})
        trial.set_user_attr("robustness_undefined", undefined)
        if tracking:
            tracking.log_metrics({f"{p}_robustness_rate": e for p, e in report.robustness().items()},
                                 prefix="dev.audit.")
        return 0.0 if undefined else mean


OBJECTIVE_METRICS = {"agreement": "objective.agreement", "tokens": "objective.tokens_per_item",
                     "cascade_cost": "objective.cascade_usd_per_1000", "robustness": "objective.robustness"}


def objective_metrics(objectives: Sequence[str], values) -> dict[str, float]:
    """A trial's values as MLflow metrics, one per objective; an infinite one (a cascade that reached no threshold)
    is left out: MLflow would store the largest float, which reads as a price.

    Example:
        >>> objective_metrics(("agreement", "cascade_cost"), (0.8, math.inf))
        {'objective.agreement': 0.8}
    """
    values = values if isinstance(values, (tuple, list)) else (values,)
    return {OBJECTIVE_METRICS[o]: float(v) for o, v in zip(objectives, values) if math.isfinite(v)}
