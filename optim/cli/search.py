"""``chateval search``: Optuna over panel shapes, one nested MLflow run per trial; the best is tested and saved.

Usage::

    chateval search --dataset faireval --trials 30                       # one worker
    chateval search --dataset faireval --trials 30 --no-test &           # more workers on the same study
    chateval search --dataset faireval --trials 30 --objectives agreement,tokens --compile none,labeled

Panel flags fix a dimension instead of setting the panel: ``--strategy one_by_one`` searches
only that strategy, ``--roles 3`` only panels of three, ``--same-role 2`` only the ablation.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import dataset_hash
from chateval_dspy.errors import ConfigError
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.evaluate_dataset import lm_slots, run_header
from chateval_dspy.run.metrics import primary_metric
from optim.cli import flags, show
from optim.report import panel_label, trials_frame
from optim.search.study import COMPILE_CHOICES, DEFAULT_STORAGE, PANELS, SearchSpace

SEARCHED = ("roles", "turns", "strategy", "aggregate")
SEARCH_HELP = {
    "roles": "search only panels of N distinct personas (default: 1-5, chosen per trial)",
    "same_role": "search only the same-role ablation with N referees",
    "role": "not for search: trials choose the personas (use --roles N)",
    "strategy": "search only this strategy (default: all three)",
    "turns": "search only N turns (default: 1-4)",
    "aggregate": "search only this aggregate (default: both)",
    "split": "not for search: it uses the seeded train/dev/test split",
    "limit": "use only the first N items of each split (train, dev, test)",
}
TOP = 10


def add_command(sub) -> None:
    p = sub.add_parser("search", help="search panel shapes (personas, turns, strategy, aggregate, compiling) with Optuna",
                       description="Each trial picks a panel, is judged on the dev split and logged as a nested MLflow "
                                   "run; the best panel is then judged once on the test split and saved. Panel flags "
                                   "narrow the search instead of setting the panel.")
    flags.add_common_flags(p)
    # Unset means "let the trial choose"; a given panel flag fixes that dimension of the search.
    p.set_defaults(strategy=None, turns=None, aggregate=None, split=None)
    for action in p._actions:  # argparse has no public way to reword a shared flag's help
        action.help = SEARCH_HELP.get(action.dest, action.help)
    g = p.add_argument_group("search")
    g.add_argument("--trials", type=int, required=True,
                   help="run until the study holds N finished (complete or pruned) trials, counting earlier runs")
    g.add_argument("--storage", default=DEFAULT_STORAGE, help=f"Optuna storage URL shared by workers (default {DEFAULT_STORAGE})")
    g.add_argument("--study", help="study name (default: <dataset>-<objectives>)")
    g.add_argument("--objectives", default="agreement",
                   help="agreement, or agreement,tokens for a Pareto front of agreement against tokens per item")
    g.add_argument("--compile", default="none",
                   help=f"{', '.join(COMPILE_CHOICES)}; a comma list (none,labeled,bootstrap) lets each trial choose")
    g.add_argument("--max-demos", type=int, default=2, help="demonstrations per predictor when a trial compiles")
    g.add_argument("--report-every", type=int, default=4, help="dev items between pruning checks (default 4)")
    g.add_argument("--no-prune", action="store_true", help="judge every trial on the whole dev split")
    g.add_argument("--no-test", action="store_true",
                   help="only run trials (for extra workers): leave testing and saving the best panel to another run")
    g.add_argument("--no-log-model", action="store_true", help="do not log the best program as an MLflow dspy model")
    p.add_argument("--out", help="directory for the best evaluator (default programs/<study>)")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)


def space_from_args(args) -> SearchSpace:
    """The search space, narrowed by any panel flag that was given."""
    if args.role:
        raise ConfigError("search chooses the personas; use --roles N to fix the panel size or --same-role N for the ablation")
    panels, n_roles = PANELS, (1, 5)
    if args.same_role is not None:
        panels, n_roles = ("same",), (args.same_role, args.same_role)
    elif args.roles is not None:
        n_roles = (args.roles, args.roles)
    return SearchSpace(
        panels=panels, n_roles=n_roles,
        turns=(args.turns, args.turns) if args.turns is not None else (1, 4),
        strategies=(args.strategy,) if args.strategy else SearchSpace.strategies,
        aggregates=(args.aggregate,) if args.aggregate else SearchSpace.aggregates,
        compile=tuple(c.strip() for c in args.compile.split(",") if c.strip()),
    )


def base_from_args(args, fmt: str):
    """Everything a trial does not choose, from the flags (the panel here is a placeholder each trial replaces)."""
    return DebateConfig(format=fmt, strategy=args.strategy or flags.default(DebateConfig, "strategy"),
                        turns=args.turns or 1, aggregate=args.aggregate or flags.default(DebateConfig, "aggregate"),
                        calibrate=not args.no_calibrate, parse_retries=args.parse_retries,
                        max_text_chars=args.max_text_chars, role_file=args.role_file,
                        consensus_stop=args.consensus_stop, weighted_scores=args.weighted_scores)


def base_settings(base) -> dict:
    """What the fixed part of every trial's config changes from the defaults.

    Only changes are recorded, so a field added to ``DebateConfig`` later (at its default)
    does not stop an older study from resuming.
    """
    return {k: v for k, v in base.changes().items() if k not in (*SEARCHED, "format")}


def _check_out(out: Path, study_name: str) -> None:
    """Refuse to write over anything but this study's own earlier result."""
    if not out.exists() or not any(out.iterdir()):
        return
    from chateval_dspy.deploy.store import read_card

    try:
        owner = read_card(out).get("search", {}).get("study")
    except ConfigError:
        owner = None
    if owner != study_name:
        raise ConfigError(f"{out} exists and does not hold study {study_name!r}'s evaluator; choose another --out")


class _Progress:
    """A progress bar per trial, opened by the trial's first item and closed when the trial is printed."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.bar = total, enabled, None

    def item(self, record: dict) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="item", leave=False, file=sys.stderr)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def trial_line(trial, metric: str) -> str:
    """One printed line per finished trial."""
    cfg = trial.user_attrs.get("config", {})
    panel = (f"{panel_label(cfg.get('roles', []))} turns={cfg.get('turns')} {cfg.get('strategy')} "
             f"{cfg.get('aggregate')} compile={trial.user_attrs.get('compile')}")
    state = trial.state.name.lower()
    if state == "pruned":
        step = max(trial.intermediate_values) if trial.intermediate_values else None
        said = f"pruned after {step} dev items ({_fmt(trial.intermediate_values[step])})" if step else "pruned"
    else:
        figure = trial.user_attrs.get("dev", {}).get(metric) or {}
        said = f"dev {metric} {_fmt(trial.values[0])} [{_fmt(figure.get('ci_low'))}, {_fmt(figure.get('ci_high'))}]"
        if trial.user_attrs.get("agreement_undefined"):
            said = f"dev {metric} undefined (constant scores), counted as 0"
        if len(trial.values) > 1:
            said += f", {trial.values[1]:,.0f} tokens/item"
    if "duplicate_of" in trial.user_attrs:
        said += f" (same panel as trial {trial.user_attrs['duplicate_of']}: not judged again)"
    return f"trial {trial.number:>3}  {said}  | {panel}"


def trials_table(study, metric: str) -> str:
    frame = trials_frame(study)
    done = frame[frame["state"].isin(["complete", "pruned"])]
    if done.empty:
        return "(no finished trials)"
    # Complete trials first: a pruned trial's value is its agreement on the items judged before it stopped.
    top = done.assign(pruned=done.state == "pruned").sort_values(
        ["pruned", "agreement", "tokens_per_item"], ascending=[True, False, True], na_position="last").head(TOP)
    shown = top.assign(
        roles=[panel_label(r.split(",")) for r in top.roles],
        **{metric: ["-" if p else f"{_fmt(a)} [{_fmt(lo)}, {_fmt(hi)}]"
                    for a, lo, hi, p in zip(top.agreement, top.ci_low, top.ci_high, top.pruned)],
           "tokens/item": [_fmt(t, 0) for t in top.tokens_per_item]},
    )[["trial", "state", "roles", "turns", "strategy", "aggregate", "compile", metric, "tokens/item", "note"]]
    title = f"top {len(top)} of {len(done)} finished trials by dev {metric}" if len(done) > TOP else \
        f"{len(done)} finished trials by dev {metric}"
    return title + "\n" + shown.to_string(index=False)


def run(args) -> int:
    import optuna

    from chateval_dspy.deploy.store import make_card, save_program
    from chateval_dspy.run.metrics import plain
    from optim.search import study as search

    if args.split is not None:
        raise ConfigError("search uses the seeded train/dev/test split itself: drop --split")
    if args.trials < 1:
        raise ConfigError(f"--trials must be positive, got {args.trials}")
    if args.report_every < 1:
        raise ConfigError(f"--report-every must be positive, got {args.report_every}")
    objectives = search.parse_objectives(args.objectives)
    data = flags.data_spec(args)
    items, fmt = data.load()
    space, base = space_from_args(args), base_from_args(args, fmt)
    parts = data.parts(items)
    if not parts["dev"] or all(x.get("label" if fmt == "pairwise" else "human") is None for x in parts["dev"]):
        raise ConfigError("search needs labelled dev items: use a dataset with human labels, more items or a larger --limit")
    if not args.no_test and not parts["test"]:
        raise ConfigError("the test split is empty: use more items or a larger --limit (or --no-test)")
    name = args.study or search.default_study_name(args.dataset, objectives)
    out = Path(args.out or Path("programs") / name)
    if not args.no_test:
        _check_out(out, name)
    if "tokens" in objectives and not args.no_cache:
        # A cached answer reports no usage, which would make a panel look free.
        print("note: tokens is an objective, so DSPy's LM cache is off for this search", file=sys.stderr)
        args.no_cache = True

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is printed below instead
    study = search.open_study(name, args.storage, objectives, seed=args.seed, prune=not args.no_prune,
                              warmup_steps=2 * args.report_every)
    settings = {"dataset": args.dataset, "format": fmt, "dataset_hash": dataset_hash(items), "seed": args.seed,
                "limit": args.limit, "objectives": list(objectives), "space": space.to_dict(), "model_spec": args.model,
                "base": base_settings(base),
                "max_demos": args.max_demos if space.compile != ("none",) else None}
    search.check_settings(study, settings)
    metric = primary_metric(fmt)
    print(f"study {name!r} in {search.redact_url(args.storage)}: {search.count(study)} of {args.trials} trials finished; "
          f"{len(parts['dev'])} dev items per trial ({'; '.join(f'{k} {len(v)}' for k, v in parts.items())})")

    progress = _Progress(len(parts["dev"]), not args.no_progress)
    objective = search.Objective(space=space, base=base, parts=parts, objectives=objectives, n_trials=args.trials,
                                 seed=args.seed, max_demos=args.max_demos, report_every=args.report_every,
                                 concurrency=args.concurrency, results_dir=Path("results") / name,
                                 track=not args.no_mlflow, on_item=progress.item)

    def printed(study, trial) -> None:
        progress.close()
        print(trial_line(trial, metric), flush=True)

    tracked = not args.no_mlflow
    params = {"study": name, "storage": search.redact_url(args.storage), **settings}
    parent = search.study_run(study, params=params, uri=args.tracking_uri) if tracked else contextlib.nullcontext()
    # The LM is laid out once for every trial. Lay it out for parallel referees only when every trial has them:
    # on a small CPU, servers split for parallel requests run a one-by-one trial on a fraction of the cores.
    slot_cfg = base.replace(roles=tuple(f"referee_{i + 1}" for i in range(space.n_roles[1])),
                            strategy="one_by_one" if "one_by_one" in space.strategies else "simultaneous_talk")
    tracking = None
    if tracked:
        from optim import tracking
    tested = None
    with parent as active:
        with flags.lm_spec(args).judging(lm_slots(slot_cfg, flags.concurrency(args))) as lm:
            model = lm.model
            if tracked:
                tracking.log_params({"model": model})
            ran = search.run_trials(study, objective, args.trials, callbacks=[printed])
            progress.close()
            finished = search.count(study)
            print(f"\nran {len(ran)} trial(s) here; the study holds {finished} finished trial(s)\n")
            print(trials_table(study, metric))
            final = _final_trial(study, out, args)
            if final is not None:
                tested = _test(final, parts, args, model, out)
        table = Path("results") / name / "trials.csv"
        table.parent.mkdir(parents=True, exist_ok=True)
        trials_frame(study).to_csv(table, index=False)
        if tracked:
            tracking.log_metrics({"trials_finished": finished})
            tracking.log_file(table, "search")
        if tested is not None:
            program, result, figures, results = tested
            cost = {k: v for k, v in result.cost().items() if k != "wall_seconds"}
            card = make_card(program, model=model, dataset=args.dataset, dataset_hash=settings["dataset_hash"],
                             split={"seed": args.seed, "fractions": [0.4, 0.2, 0.4], "limit": args.limit,
                                    "sizes": {k: len(v) for k, v in parts.items()}},
                             optimizer=search.config_of(final)[1], metric=metric,
                             search={"study": name, "storage": search.redact_url(args.storage), "trial": final.number,
                                     "objectives": list(objectives), "trials_finished": finished,
                                     "space": space.to_dict(), "values": list(final.values)},
                             dev_metrics=final.user_attrs.get("dev", {}), test_metrics=plain(figures), cost=cost)
            save_program(program, out, card)
            study.set_user_attr("final", {"trial": final.number, "out": str(out),
                                          "test": {metric: card["test_metrics"].get(metric)}})
            if tracked:
                tracking.log_metrics({"best_trial": final.number,
                                      **{f"best.dev.{o}": v for o, v in zip(objectives, final.values)}})
                tracking.log_metrics(figures, cost, prefix="test.")
                tracking.log_file(out, "evaluator")
                tracking.log_file(results, "results")
                if not args.no_log_model:
                    tracking.log_dspy_model(program)  # outside the LM context: no client or key travels with it
            print(f"\nsaved evaluator: {out} (card: {out / 'card.md'})")
    if tracked:
        print(f"mlflow run: {active.info.run_id}")
    print(f"resume or extend: the same command with a larger --trials; plots: chateval report {name}"
          + (f" --storage {search.redact_url(args.storage)}" if args.storage != DEFAULT_STORAGE else ""))
    return 0


def _test(trial, parts: dict, args, model: str, out: Path):
    """Rebuild the trial's panel (compiling again on train if it did), judge the test split once, print the summary."""
    from optim.search import study as search

    cfg, choice = search.config_of(trial)
    program = search.build_for_trial(cfg, choice, parts["train"], max_demos=args.max_demos, seed=args.seed)
    results = out / "results" / "test.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("", encoding="utf-8")
    with show.progress(len(parts["test"]), not args.no_progress) as on_item:
        result = evaluate(program, parts["test"], cfg, out=results, concurrency=args.concurrency, on_item=on_item)
    print(f"\n== best trial {trial.number} on the test split ==")
    figures = show.summary(result, run_header(flags.data_spec(args), cfg, model, result.n, "test"), args.seed)
    return program, result, figures, results


def _final_trial(study, out: Path, args):
    """The trial to test and save now, or None (with the reason printed)."""
    from optuna.trial import TrialState

    from optim.search import study as search

    if args.no_test:
        print("\n--no-test: the best panel is tested and saved by a run without --no-test")
        return None
    running = search.count(study, (TrialState.RUNNING,))
    if running:
        print(f"\n{running} trial(s) still running in other workers: the last worker to finish tests the best panel")
        return None
    if not search.count(study, (TrialState.COMPLETE,)):
        print("\nno complete trial (all were pruned or failed): nothing to test; run more trials")
        return None
    best = search.best_trial(study)
    done = study.user_attrs.get("final") or {}
    if done.get("trial") == best.number and done.get("out") == str(out) and (out / "card.json").exists():
        print(f"\nbest trial {best.number} was already tested and saved in {out}")
        return None
    return best


