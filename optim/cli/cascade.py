"""``chateval cascade``: build a cascade of saved evaluators, cheapest first, whose verdicts agree with people at a
guaranteed level, and report each stage's share, agreement and cost (``optim.tuning.cascade``)."""

from __future__ import annotations

from optim.cli import flags, show


def add_command(sub) -> None:
    p = sub.add_parser("cascade", help="build a cascade of saved evaluators (cheap first) with thresholds that "
                                       "guarantee an agreement level, and report its cost beside each stage alone")
    p.add_argument("--spec", metavar="FILE", help="the cascade declared in YAML: level, risk, stages (name, program, "
                                                  "optionally model, a model name); programs as --stage takes them")
    p.add_argument("--stage", action="append", default=[], metavar="NAME=PROGRAM_DIR[@MODEL]",
                   help="a stage (repeat, cheapest first): a saved evaluator, run on MODEL (default: its card's)")
    p.add_argument("--agree-at-least", type=float, metavar="LEVEL",
                   help="with --stage: the agreement with people the verdicts given must reach, e.g. 0.85")
    p.add_argument("--risk", type=float, help="with --stage: the accepted chance that the guarantee fails, e.g. 0.1")
    p.add_argument("--out", required=True, metavar="DIR", help="the saved cascade's directory (load() and "
                                                               "chateval score/serve take it)")
    flags.add_held_out_flags(p)
    p.add_argument("--seed", type=int, help="split seed (default: the one the stages' cards record, else 0); the "
                                            "calibration/check halves are drawn with it too")
    flags.add_lm_flags(p, loaded=True)  # --model: every stage whose declaration names none, else each card's
    p.add_argument("--method", choices=["isotonic", "platt"], default="isotonic",
                   help="the stages' confidence maps' shape (default isotonic; platt: steadier on small splits)")
    p.add_argument("--out-dir", default="reports/cascade",
                   help="each stage's results file, the fitted stages and report.json (default reports/cascade); a "
                        "rerun resumes them")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)


def declared(args):
    """The cascade the flags declare: ``--spec``, or ``--stage``s with ``--agree-at-least`` and ``--risk``."""
    from chateval_dspy.errors import ConfigError
    from optim.tuning.cascade import declare, read_declaration

    if args.spec is None:
        return declare(args.stage, level=args.agree_at_least, risk=args.risk)
    if args.stage or args.agree_at_least is not None or args.risk is not None:
        raise ConfigError(f"--spec {args.spec} declares the stages, level and risk: give --stage, --agree-at-least "
                          "and --risk without it, or change the file")
    return read_declaration(args.spec)


def run(args) -> int:
    """Exit 0 also when no stage reaches the level: the cascade is saved without thresholds (every item then goes
    to a person) and the report says NOT REACHED, with the best level reachable."""
    from optim.tuning.cascade import build_cascade, log_report

    cascade = declared(args)
    data = flags.held_out_spec(args)
    with show.progress(None, not args.no_progress) as on_item:
        report = build_cascade(cascade, data, out=args.out, out_dir=args.out_dir, method=args.method, seed=args.seed,
                               lm=flags.lm_spec(args), concurrency=flags.concurrency(args), on_item=on_item)
    log = None if args.no_mlflow else lambda: log_report(report, data, method=args.method, uri=args.tracking_uri)
    return show.fitted(report, command="cascade", level=cascade.level, risk=cascade.risk, log=log,
                       resumed=f"resumed: {report.resumed} stage verdict(s) were already in the results files")
