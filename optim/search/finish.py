"""The end of a search: the best panel judged once on the test split, saved like a compiled program, logged.

One worker does it, once the study is complete, after claiming the best trial (``final_claim:<trial>``, created if
absent; a dead or done worker's claim is taken over). The output folder is marked as the study's first
(``results/search.json``), so a rerun after a kill resumes the test, and the study's ``final`` attribute last: until
then a rerun does what is left.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.run import identity, records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.result import RunResult
from optim.search.objective import build_for_trial, config_of
from optim.search.study import best_trial, claim_attr, count
from optim.search.worker import Worker, dead
from optim.tuning.compile import OptimizerSettings, save_gated

OWNER_FILE = "search.json"  # under <out>/results/


def check_out(out: Path, study_name: str) -> None:
    """Refuse to write over anything but this study's own result, finished or not."""
    if not out.exists() or not any(p.is_file() for p in out.rglob("*")):  # a kill may leave empty folders
        return
    from chateval_dspy.deploy.saved.store import read_card

    owner = None
    with contextlib.suppress(ConfigError):
        owner = read_card(out).get("search", {}).get("study")
    if owner is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            owner = json.loads((out / "results" / OWNER_FILE).read_text(encoding="utf-8")).get("study")
    if owner != study_name:
        raise ConfigError(f"{out} exists and does not hold study {study_name!r}'s evaluator; choose another --out")


@dataclass(frozen=True)
class Final:
    """The trial this worker tests and saves now, or why there is none."""

    trial: FrozenTrial | None
    reason: str | None = None


def choose_final(study: optuna.Study, out: Path, *, test: bool = True) -> Final:
    """The best trial, claimed for this worker, unless there is nothing (left) for it to test."""
    if not test:
        return Final(None, "--no-test: the best panel is tested and saved by a run without --no-test")
    running = count(study, (TrialState.RUNNING,))
    if running:
        return Final(None, f"{running} trial(s) still running in other workers: the last worker to finish "
                           "tests the best panel")
    if not count(study, (TrialState.COMPLETE,)):
        return Final(None, "no complete trial (all were pruned or failed): nothing to test; run more trials")
    best = best_trial(study)
    done = study.user_attrs.get("final") or {}
    if done.get("trial") == best.number and done.get("out") == str(out) and (out / "card.json").exists():
        return Final(None, f"best trial {best.number} was already tested and saved in {out}")
    mine = {"worker": Worker.current().tag(), "out": str(out)}
    held = claim_attr(study, f"final_claim:{best.number}", mine)
    if held.get("worker") != mine["worker"]:
        if not held.get("done") and not dead(held.get("worker")):
            return Final(None, f"best trial {best.number} is being tested by worker {held.get('worker')} "
                               f"(into {held.get('out')}); it saves the result")
        study.set_user_attr(f"final_claim:{best.number}", mine)  # its worker died, or finished elsewhere
    return Final(best)


@dataclass
class Tested:
    """The best trial's program and its figures on the test split."""

    trial: FrozenTrial
    program: ChatEval
    result: RunResult
    figures: dict
    results: Path
    items: list


def final_test(study: optuna.Study, trial: FrozenTrial, parts: dict, out: Path, *,
               settings: OptimizerSettings | None = None, seed: int = 0, n_resamples: int | None = None,
               concurrency: int = 1, on_item=None) -> Tested:
    """Rebuild the trial's panel (compiling again on train if it did) and judge the test split once, on the LM of
    the current DSPy context, resuming what a killed test left."""
    cfg, choice = config_of(trial)
    program = build_for_trial(cfg, choice, parts["train"], settings or OptimizerSettings())
    results = out / "results" / "test.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    (out / "results" / OWNER_FILE).write_text(json.dumps({"study": study.study_name, "trial": trial.number}),
                                              encoding="utf-8")
    key = identity.run_key(cfg, identity.context_identity(), parts["test"], program.dump_state())
    try:
        records.finished_records(results, key)
    except ValueError:  # an earlier best panel's test (ConfigError) or a damaged file: this test starts afresh
        results.write_text("", encoding="utf-8")
    result = evaluate(program, parts["test"], cfg, out=results, concurrency=concurrency, on_item=on_item, run_key=key)
    return Tested(trial, program, result, result.metrics(seed=seed, n_resamples=n_resamples), results, parts["test"])


def save_final(study: optuna.Study, tested: Tested, out: Path, *, model: str, card: dict, tracking=None,
               referee_models: dict[str, str] | None = None, gates=None, lm=None, seed: int = 0,
               concurrency: int = 1) -> dict:
    """Save the tested program with its card (``card`` adds data, split and search fields), log it, mark it done;
    returns the card written. ``gates`` are measured on the saved program over the test split (on ``lm``) and
    checked before anything is logged or registered: a failure raises ``GateRefused``, and the study is not done.
    """
    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.run.metrics import plain, primary_metric
    from optim.tracking.evaluation import unpriced_marks

    trial, program = tested.trial, tested.program
    cfg, choice = config_of(trial)
    metric = primary_metric(cfg.task_spec)
    cost = tested.result.card_cost()
    written = make_card(program, model=model, referee_models=referee_models, optimizer=choice, metric=metric,
                        dev_metrics=trial.user_attrs.get("dev", {}), test_metrics=plain(tested.figures), cost=cost,
                        **card)
    written = save_gated(program, out, written, held_out=(tested.items, tested.results, card.get("dataset")), seed=seed,
                         gates=gates, lm=lm, concurrency=concurrency, tracking=tracking)
    if tracking is not None and tracking.enabled:
        from optim.tracking import runs as mlflow_tracking

        objectives = written.get("search", {}).get("objectives", ["agreement"])
        mlflow_tracking.log_metrics({"best_trial": trial.number,
                                     **{f"best.dev.{o}": v for o, v in zip(objectives, trial.values)
                                        if math.isfinite(v)}})
        mlflow_tracking.log_metrics(tested.figures, {**cost, **tested.result.model_metrics()}, prefix="test.")
        mlflow_tracking.log_params(unpriced_marks(cost, prefix="test."))
        mlflow_tracking.log_file(tested.results, "results")
    study.set_user_attr("final", {"trial": trial.number, "out": str(out),
                                  "test": {metric: written["test_metrics"].get(metric)}})
    study.set_user_attr(f"final_claim:{trial.number}", {"worker": Worker.current().tag(), "out": str(out),
                                                         "done": True})
    return written
