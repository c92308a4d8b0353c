"""``chateval compile``: tune every referee's instructions and demos against the human labels, report test
before/after with CIs, save the evaluator and log it to MLflow (``optim.tuning.compile.compile_and_save``)."""

from __future__ import annotations

from optim.cli import flags
from optim.tuning.settings import BUDGETS, OPTIMIZERS, OptimizerSettings


def add_command(sub, settings: OptimizerSettings | None = None) -> None:
    """The ``compile`` parser; the optimizer flags default to ``settings``' fields (default ``OptimizerSettings()``)."""
    settings = settings or OptimizerSettings()
    p = sub.add_parser("compile", help="tune every referee's instructions and demos against the human labels",
                       description="Rerunning the same command after an interruption finishes the job: nothing "
                                   "already judged is judged again, and the card and MLflow logging are completed.")
    flags.add_common_flags(p, dataset_required=False)
    g = p.add_argument_group("labels")
    g.add_argument("--labels", action="append", metavar="SOURCE",
                   help="people's labels, repeatable: mlflow:<experiment>[?filter=<trace filter>] (human feedback on "
                        "traced debates: the MLflow Review page or mlflow.log_feedback) or a CSV/JSONL file (id, label "
                        "or one column per criterion, optionally reviewer). Labelled items train; a dataset item of "
                        "the same id leaves dev/test. MLflow feedback overrides a file, a file the dataset. Without "
                        "--dataset the labelled items are the data, split by --seed")
    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", default="bootstrap", choices=list(OPTIMIZERS))
    g.add_argument("--metric", help="agreement or balanced (pairwise; default agreement); score_error (pointwise)")
    g.add_argument("--max-demos", type=int, default=settings.max_demos,
                   help="demonstrations per predictor (default %(default)s)")
    g.add_argument("--candidates", type=int, default=settings.candidates,
                   help="candidate programs (bootstrap_rs, simba; default %(default)s)")
    g.add_argument("--auto", default=settings.auto, choices=list(BUDGETS),
                   help="MIPROv2/GEPA budget")
    g.add_argument("--threads", type=int, default=settings.threads,
                   help="items an optimizer evaluates at once (default %(default)s)")
    flags.add_model_flags(g, "the program")
    p.add_argument("--out", required=True, help="directory for the saved evaluator (programs/NAME)")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)
    flags.add_gate_flags(p)


def run(args) -> int:
    from chateval_dspy.errors import ConfigError
    from optim.cli.hooks import CompilePrinted
    from optim.tuning.compile import compile_and_save
    from optim.tuning.labels import LabelledData

    if not args.dataset and not args.labels:
        raise ConfigError("compile needs --dataset, --labels, or both")
    data = flags.data_spec(args) if args.dataset else None
    if args.labels:  # people's labels on top of the dataset's
        data = LabelledData(tuple(args.labels), data, task=flags.task(args) or args.format, seed=args.seed,
                            limit=args.limit, tracking_uri=args.tracking_uri)
    settings = OptimizerSettings(max_demos=args.max_demos, candidates=args.candidates, auto=args.auto,
                                 threads=args.threads, seed=args.seed)
    gates = flags.gates(args)
    done = compile_and_save(data, lambda fmt: flags.debate_config(args, fmt, flags.task(args)), flags.lm_spec(args),
                            optimizer=args.optimizer, out=args.out, metric=args.metric, settings=settings,
                            tracking=flags.tracking_spec(args), concurrency=flags.concurrency(args),
                            hooks=CompilePrinted(not args.no_progress), gates=gates)
    print(f"\nsaved evaluator: {done.out} (card: {done.out / 'card.md'})")
    if gates.any:
        print(f"gates passed, measured on the test split: certificate in {done.out / 'card.md'}")
    if done.mlflow_run_id:
        print(f"mlflow run: {done.mlflow_run_id}")
    return 0
