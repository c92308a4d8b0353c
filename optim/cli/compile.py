"""``chateval compile``: tune every referee's instructions and demos against the human labels, report test
before/after with CIs, save the evaluator and log it to MLflow."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from chateval_dspy.data.loaders import dataset_hash
from chateval_dspy.errors import ConfigError
from optim.cli import flags, show
from optim.evaluation import run_params


def add_command(sub) -> None:
    from optim.compile import OPTIMIZERS

    p = sub.add_parser("compile", help="tune every referee's instructions and demos against the human labels")
    flags.add_common_flags(p)
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
    flags.add_tracking_flags(p)


def run(args) -> int:
    from chateval_dspy.deploy.store import make_card, save_program
    from chateval_dspy.program.chateval import build_evaluator
    from chateval_dspy.run.evaluate import evaluate
    from chateval_dspy.run.evaluate_dataset import lm_slots, run_header
    from chateval_dspy.run.metrics import plain
    from chateval_dspy.run.records import run_key
    from chateval_dspy.run.table import summary_table
    from optim import tracking
    from optim.compile import OptimizerSettings, compile_evaluator, optimizer_progress
    from optim.objectives import make_metric

    data, lm_spec = flags.data_spec(args), flags.lm_spec(args)
    items, fmt = data.load()
    cfg = flags.debate_config(args, fmt)
    parts = data.parts(items)
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
    params = run_params(data, cfg, "(set below)", items, optimizer=args.optimizer, optimizer_settings=settings.to_dict(),
                        metric=metric_name, n_train=len(parts["train"]), n_dev=len(parts["dev"]), n_test=len(parts["test"]))
    params.pop("model")
    tracked = not args.no_mlflow
    run = tracking.run("compile", params=params, uri=args.tracking_uri,
                       tags={"command": "compile", "optimizer": args.optimizer}) if tracked else contextlib.nullcontext()
    with run:
        with lm_spec.judging(lm_slots(cfg, max(flags.concurrency(args), args.threads))) as lm:
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
                key = run_key(cfg, lm_spec.identity(), parts["test"]) + f"-{stage}-{args.optimizer}"
                with show.progress(len(parts["test"]), not args.no_progress) as on_item:
                    result = evaluate(compiled or student, parts["test"], cfg, out=work / f"test_{stage}.jsonl",
                                      concurrency=args.concurrency, on_item=on_item, run_key=key)
                figures[stage], costs[stage] = result.metrics(seed=args.seed), result.cost()
                print(f"\n== test split, {stage} compiling ==")
                print(summary_table(figures[stage], costs[stage], run_header(data, cfg, model, result.n, "test")))
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
