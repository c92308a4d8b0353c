"""The full ``chateval`` command: the runtime commands plus compile, search and report, all tracked in MLflow."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from chateval_dspy.data.loaders import dataset_hash
from chateval_dspy.errors import ConfigError
from optim.cli import runtime as runtime


def add_tracking_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tracking")
    g.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite under ./mlruns)")
    g.add_argument("--no-mlflow", action="store_true", help="do not log this run to MLflow")


def run_params(args, cfg, model: str, items, **extra) -> dict:
    return {"config": cfg.to_dict(), "model": model, "dataset": args.dataset, "dataset_hash": dataset_hash(items),
            "split": args.split, "seed": args.seed, "limit": args.limit, **extra}


def cmd_evaluate(args) -> int:
    cfg, items, result, header, out = runtime.run_evaluate(args)
    metrics = runtime.print_summary(result, header, args.seed)
    print(f"results: {out}")
    if not args.no_mlflow:
        from optim import tracking

        with tracking.run("evaluate", params=run_params(args, cfg, header["model"], items), uri=args.tracking_uri,
                          tags={"command": "evaluate"}) as active:
            tracking.log_metrics(metrics, result.cost())
            tracking.log_file(out, "results")
        print(f"mlflow run: {active.info.run_id}")
    return 0


def _add_compile(sub) -> None:
    from optim.compile import OPTIMIZERS

    p = sub.add_parser("compile", help="tune every referee's instructions and demos against the human labels")
    runtime.add_common_flags(p)
    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", default="bootstrap", choices=list(OPTIMIZERS))
    g.add_argument("--metric", help="agreement or balanced (pairwise; default agreement); score_error (scoring)")
    g.add_argument("--max-demos", type=int, default=2, help="demonstrations per predictor")
    g.add_argument("--candidates", type=int, default=4, help="candidate programs (bootstrap_rs, simba)")
    g.add_argument("--auto", default="light", choices=["light", "medium", "heavy"], help="MIPROv2/GEPA budget")
    g.add_argument("--threads", type=int, default=1, help="items an optimizer evaluates at once")
    g.add_argument("--no-log-model", action="store_true", help="do not log the program as an MLflow dspy model")
    g.add_argument("--register", metavar="NAME", help="register the logged model under this name")
    p.add_argument("--out", required=True, help="directory for the saved evaluator (programs/NAME)")
    p.add_argument("--no-progress", action="store_true")
    add_tracking_flags(p)


def cmd_compile(args) -> int:
    from chateval_dspy.data.loaders import split as split_items
    from chateval_dspy.deploy.store import make_card, save_program
    from chateval_dspy.program.chateval import build_evaluator
    from chateval_dspy.run.metrics import plain
    from chateval_dspy.run.table import summary_table
    from optim import tracking
    from optim.compile import OptimizerSettings, compile_evaluator, optimizer_progress
    from optim.objectives import make_metric

    items, fmt = runtime.load_items(args)
    cfg = runtime.config_from_args(args, fmt)
    parts = {k: v[: args.limit] if args.limit else v for k, v in split_items(items, seed=args.seed).items()}
    if not parts["train"] or not parts["test"]:
        raise ConfigError("the train or test split is empty: use more items or a larger --limit")
    metric_name = args.metric or ("agreement" if fmt == "pairwise" else "score_error")
    metric = make_metric(metric_name, fmt, parts["train"])
    settings = OptimizerSettings(max_demos=args.max_demos, candidates=args.candidates, auto=args.auto,
                                 threads=args.threads, seed=args.seed)
    out = Path(args.out)
    if (out / "card.json").exists():
        raise ConfigError(f"{out} already holds a compiled evaluator; choose another --out")
    # An interrupted compile left only results/: rerunning resumes the test files, and the LM cache
    # answers every call the optimizer already made, so no finished LM call is repeated.
    work = out / "results"
    work.mkdir(parents=True, exist_ok=True)
    student = build_evaluator(cfg)
    figures, costs = {}, {}
    params = run_params(args, cfg, "(set below)", items, optimizer=args.optimizer, optimizer_settings=settings.to_dict(),
                        metric=metric_name, n_train=len(parts["train"]), n_dev=len(parts["dev"]), n_test=len(parts["test"]))
    params.pop("model")
    tracked = not args.no_mlflow
    run = tracking.run("compile", params=params, uri=args.tracking_uri,
                       tags={"command": "compile", "optimizer": args.optimizer}) if tracked else contextlib.nullcontext()
    with run:
        with runtime.lm_context(args, cfg) as lm:
            model = lm.model
            if tracked:
                tracking.log_params({"model": model})
                tracking.autolog_compiles()
            compiled = None
            for stage in ("before", "after"):
                if stage == "after":
                    print(f"compiling with {args.optimizer} on {len(parts['train'])} train / {len(parts['dev'])} dev items",
                          file=sys.stderr)
                    compiled = compile_evaluator(student, optimizer=args.optimizer, trainset=parts["train"],
                                                 valset=parts["dev"], metric=metric, settings=settings)
                    dev_scores = optimizer_progress(compiled)
                    if dev_scores:
                        print(f"{args.optimizer}: {len(dev_scores)} dev evaluations, best dev {metric_name} "
                              f"{max(v for _, v in dev_scores):.3f} (first {dev_scores[0][1]:.3f})", file=sys.stderr)
                    if tracked:
                        for step, value in dev_scores:
                            tracking.log_metrics({"optimizer.dev_score": value}, step=step)
                key = runtime.run_key(args, cfg, parts["test"]) + f"-{stage}-{args.optimizer}"
                result = runtime.run_judged(compiled or student, parts["test"], cfg, args, work / f"test_{stage}.jsonl",
                                            progress=not args.no_progress, key=key)
                figures[stage], costs[stage] = result.metrics(seed=args.seed), result.cost()
                print(f"\n== test split, {stage} compiling ==")
                print(summary_table(figures[stage], costs[stage], runtime.header_of(args, cfg, model, result.n, "test")))
                if tracked:
                    tracking.log_metrics(figures[stage], costs[stage], prefix=f"test_{stage}.")
        card = make_card(compiled, model=model, dataset=args.dataset, dataset_hash=dataset_hash(items),
                         split={"seed": args.seed, "fractions": [0.4, 0.2, 0.4], "limit": args.limit,
                                "sizes": {k: len(v) for k, v in parts.items()}},
                         optimizer=args.optimizer, optimizer_settings=settings.to_dict(), metric=metric_name,
                         test_metrics={s: plain(figures[s]) for s in figures},
                         cost={k: v for k, v in costs["after"].items() if k != "wall_seconds"})
        save_program(compiled, out, card)
        if tracked:
            tracking.log_file(out, "evaluator")
            if not args.no_log_model:
                tracking.log_dspy_model(compiled, registered_name=args.register)
                tracking.log_pyfunc_model(out)
    print(f"\nsaved evaluator: {out} (card: {out / 'card.md'})")
    return 0


def build_parser():
    parser, sub = runtime.build_parser()
    add_tracking_flags(sub.choices["evaluate"])
    _add_compile(sub)
    for extra in _extensions():
        extra.add_command(sub)
    return parser


def _extensions():
    """Commands living in their own optim modules (search, report)."""
    import importlib

    found = []
    for name in ("optim.cli.search", "optim.cli.report"):
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return found


def main(argv: list[str] | None = None) -> int:
    commands = {**runtime.COMMANDS, "evaluate": cmd_evaluate, "compile": cmd_compile}
    for extra in _extensions():
        commands.update(extra.COMMANDS)
    return runtime.main(argv, parser=build_parser(), commands=commands)


if __name__ == "__main__":
    sys.exit(main())
