"""``chateval search``: Optuna over panel shapes, one nested MLflow run per trial; the best is tested and saved
(``optim.search.run.run_search``; examples in docs/search.md). Panel flags fix a dimension
instead of setting the panel: ``--roles 3`` searches only panels of three, ``--same-role 2`` only the ablation.
"""

from __future__ import annotations

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from optim.cli import flags
from optim.search.space import COMPILE_CHOICES, SearchSpace, parse_objectives
from optim.search.study_spec import DEFAULT_STORAGE, StudySpec, default_study_name
from optim.tuning.settings import OptimizerSettings

SEARCH_HELP = {
    "roles": "search only panels of N distinct personas (default: {n_roles[0]}-{n_roles[1]}, chosen per trial)",
    "same_role": "search only the same-role ablation with N referees",
    "role": "not for search: trials choose the personas (use --roles N)",
    "strategy": "search only this strategy (default: all three)",
    "turns": "search only N turns (default: {turns[0]}-{turns[1]})",
    "aggregate": "search only this aggregate (default: both)",
    "split": "not for search: it uses the seeded train/dev/test split",
    "limit": "use only the first N items of each split (train, dev, test)",
}


def add_command(sub) -> None:
    p = sub.add_parser("search", help="search panel shapes (personas, turns, strategy, aggregate, compiling) with Optuna",
                       description="Each trial picks a panel, is judged on the dev split and logged as a nested MLflow "
                                   "run; the best panel is then judged once on the test split and saved. Panel flags "
                                   "narrow the search instead of setting the panel.")
    flags.add_common_flags(p)
    # Unset means "let the trial choose"; a given panel flag fixes that dimension of the search.
    p.set_defaults(strategy=None, turns=None, aggregate=None, split=None)
    ranges = {"n_roles": flags.default(SearchSpace, "n_roles"), "turns": flags.default(SearchSpace, "turns")}
    for action in p._actions:  # argparse has no public way to reword a shared flag's help
        action.help = SEARCH_HELP[action.dest].format(**ranges) if action.dest in SEARCH_HELP else action.help
    g = p.add_argument_group("search")
    g.add_argument("--trials", type=int, required=True,
                   help="run until the study holds N finished (complete or pruned) trials, counting earlier runs")
    g.add_argument("--storage", default=DEFAULT_STORAGE, help=f"Optuna storage URL shared by workers (default {DEFAULT_STORAGE})")
    g.add_argument("--study", help="study name (default: <dataset>-<objectives>)")
    g.add_argument("--objectives", default=",".join(flags.default(StudySpec, "objectives")),
                   help="agreement; agreement,tokens for a Pareto front of agreement against tokens per item; "
                        "agreement,cascade_cost against the USD per 1,000 verdicts of the cascade [--first-stage -> "
                        "the trial's panel] at the guaranteed level (in-sample on dev: build the cascade to use with "
                        "chateval cascade on held-out items); add ,robustness for the bias audit's mean robustness "
                        "rate (verbosity, authority, bandwagon, distraction) on the dev items, e.g. "
                        "agreement,robustness or agreement,cascade_cost,robustness (each trial then judges its dev items "
                        "up to five more times)")
    g.add_argument("--first-stage", metavar="PROGRAM_DIR[@MODEL]",
                   help="with cascade_cost: a saved cheap evaluator, judged once on the dev items and reused by every "
                        "trial, run on MODEL (default: its card's)")
    g.add_argument("--agree-at-least", type=float, metavar="LEVEL",
                   help="with cascade_cost: the agreement with people the cascade's verdicts must reach, e.g. 0.85")
    g.add_argument("--risk", type=float, help="with cascade_cost: the accepted chance that the guarantee fails")
    g.add_argument("--compile", default=",".join(flags.default(SearchSpace, "compile")),
                   help=f"{', '.join(COMPILE_CHOICES)}; a comma list (none,labeled,bootstrap) lets each trial choose")
    g.add_argument("--max-demos", type=int, default=flags.default(OptimizerSettings, "max_demos"),
                   help="demonstrations per predictor when a trial compiles (default %(default)s)")
    g.add_argument("--report-every", type=int, default=flags.default(StudySpec, "report_every"),
                   help="dev items between pruning checks (default %(default)s)")
    g.add_argument("--no-prune", action="store_true", help="judge every trial on the whole dev split")
    g.add_argument("--no-test", action="store_true",
                   help="only run trials (for extra workers): a worker without --no-test waits for this one's "
                        "trials, then tests and saves the best panel")
    flags.add_model_flags(g, "the best program")
    p.add_argument("--out", help="directory for the best evaluator (default programs/<study>)")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)
    flags.add_gate_flags(p)


def space_from_args(args, defaults: SearchSpace | None = None) -> SearchSpace:
    """The search space ``defaults`` (default: ``SearchSpace()``'s own ranges), narrowed by any panel flag given."""
    if args.role:
        raise ConfigError("search chooses the personas; use --roles N to fix the panel size or --same-role N for the ablation")
    defaults = defaults or SearchSpace()
    panels, n_roles = defaults.panels, defaults.n_roles
    if args.same_role is not None:
        panels, n_roles = ("same",), (args.same_role, args.same_role)
    elif args.roles is not None:
        n_roles = (args.roles, args.roles)
    return SearchSpace(
        panels=panels, n_roles=n_roles,
        turns=(args.turns, args.turns) if args.turns is not None else defaults.turns,
        strategies=(args.strategy,) if args.strategy else defaults.strategies,
        aggregates=(args.aggregate,) if args.aggregate else defaults.aggregates,
        compile=tuple(c.strip() for c in args.compile.split(",") if c.strip()),
    )


def base_from_args(args, fmt: str, task=None) -> DebateConfig:
    """Everything a trial does not choose, from the flags (the panel here is a placeholder each trial replaces)."""
    return DebateConfig(format=fmt, strategy=args.strategy or flags.default(DebateConfig, "strategy"),
                        turns=args.turns or 1, aggregate=args.aggregate or flags.default(DebateConfig, "aggregate"),
                        calibrate=not args.no_calibrate, parse_retries=args.parse_retries,
                        max_text_chars=args.max_text_chars, role_file=args.role_file,
                        consensus_stop=args.consensus_stop, weighted_scores=args.weighted_scores, task=task)


def cascade_from_args(args):
    """The cascade a ``cascade_cost`` search holds fixed (its first stage, level and risk), or None without
    ``--first-stage``, ``--agree-at-least`` and ``--risk`` (``run_search`` says which objective wants them)."""
    from optim.tuning.cascade import FIRST_STAGE, declare

    given = [f for f, v in (("--first-stage", args.first_stage), ("--agree-at-least", args.agree_at_least),
                            ("--risk", args.risk)) if v is not None]
    if not given:
        return None
    if len(given) < 3:
        raise ConfigError(f"{', '.join(given)} given: a searched cascade needs --first-stage PROGRAM_DIR[@MODEL], "
                          "--agree-at-least LEVEL and --risk R together")
    return declare([f"{FIRST_STAGE}={args.first_stage}"], level=args.agree_at_least, risk=args.risk)


def run(args) -> int:
    import optuna

    from optim.cli.hooks import SearchPrinted
    from optim.search.run import run_search
    from optim.tracking.stores import redact_url

    if args.split is not None:
        raise ConfigError("search uses the seeded train/dev/test split itself: drop --split")
    objectives = parse_objectives(args.objectives)
    gates = flags.gates(args)
    name = args.study or default_study_name(args.dataset, objectives)
    spec = StudySpec(name, trials=args.trials, storage=args.storage, objectives=objectives, prune=not args.no_prune,
                     report_every=args.report_every)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is printed instead
    data = flags.data_spec(args)
    done = run_search(data, lambda fmt: base_from_args(args, fmt, data.task), flags.lm_spec(args), study=spec,
                      space=space_from_args(args), settings=OptimizerSettings(max_demos=args.max_demos, seed=args.seed),
                      out=args.out, test=not args.no_test, tracking=flags.tracking_spec(args),
                      concurrency=flags.concurrency(args), hooks=SearchPrinted(not args.no_progress),
                      cascade=cascade_from_args(args), gates=gates)
    if done.saved:
        print(f"\nsaved evaluator: {done.out} (card: {done.out / 'card.md'})")
        if gates.any:
            print(f"gates passed, measured on the test split: certificate in {done.out / 'card.md'}")
    if "cascade_cost" in objectives:
        from optim.tuning.cascade import IN_SAMPLE_NOTE

        print(f"cascade cost: {IN_SAMPLE_NOTE}")
    if done.mlflow_run_id:
        print(f"mlflow run: {done.mlflow_run_id}")
    print(f"resume or extend: the same command with a larger --trials; plots: chateval report {name}"
          + (f" --storage {redact_url(args.storage)}" if args.storage != DEFAULT_STORAGE else ""))
    return 0
