"""``chateval calibrate``: fit a saved evaluator's verdict confidence to people's labels, and choose the
threshold that guarantees an agreement level (``optim.tuning.calibrate``)."""

from __future__ import annotations

from optim.cli import flags, show


def add_command(sub) -> None:
    p = sub.add_parser("calibrate", help="fit a saved evaluator's confidence on a held-out split and choose the "
                                         "confidence threshold for a guaranteed agreement level")
    p.add_argument("--program", required=True, metavar="DIR", help="saved evaluator directory (calibration.json is "
                                                                    "written there)")
    flags.add_held_out_flags(p)
    p.add_argument("--seed", type=int, help="split seed (default: the one the evaluator's card records, else 0); "
                                            "the calibration/check halves are drawn with it too")
    flags.add_lm_flags(p, loaded=True)
    p.add_argument("--agree-at-least", type=float, metavar="LEVEL",
                   help="the agreement with people the verdicts given must reach, e.g. 0.85 (with --risk)")
    p.add_argument("--risk", type=float, help="the accepted chance that the guarantee fails, e.g. 0.1")
    p.add_argument("--method", choices=["isotonic", "platt"], default="isotonic",
                   help="the confidence map's shape (default isotonic; platt: steadier on small splits)")
    p.add_argument("--out-dir", default="reports/calibration",
                   help="results file and reliability diagrams (default reports/calibration); a rerun resumes it")
    p.add_argument("--no-progress", action="store_true")
    flags.add_tracking_flags(p)


def run(args) -> int:
    """Exit 0 also when the level asked for is not reached: the map is saved without a threshold and the
    report says so, with the best level reachable (``calibration.json`` then has no threshold)."""
    from optim.tuning.calibrate import calibrate, log_report

    data = flags.held_out_spec(args)
    with show.progress(None, not args.no_progress) as on_item:
        report = calibrate(args.program, data, out_dir=args.out_dir, lm=flags.lm_spec(args),
                           concurrency=flags.concurrency(args), level=args.agree_at_least,
                           risk=args.risk, method=args.method, seed=args.seed, on_item=on_item)
    if report.ece_calibrated is not None:  # the certificate's calibration error, beside the card's calibration
        from optim.certify.certificate import calibration_part, fill

        fill(args.program, "calibration", calibration_part(report))
    log = None if args.no_mlflow else lambda: log_report(report, data, method=args.method, uri=args.tracking_uri)
    return show.fitted(report, command="calibrate", level=args.agree_at_least, risk=args.risk, log=log,
                       resumed=f"resumed: {report.resumed} item(s) were already judged in {report.results}")
