"""``chateval audit``: how often perturbations a fair judge would ignore move a saved evaluator's verdicts
(``optim.audit``)."""

from __future__ import annotations

import sys

from optim.cli import flags


def add_command(sub) -> None:
    p = sub.add_parser("audit", help="bias audit of a saved evaluator: position, verbosity, authority, bandwagon and "
                                     "distraction probes on your items, each with a 95%% interval")
    p.add_argument("program", metavar="PROGRAM", help="saved evaluator directory or MLflow model URI")
    p.add_argument("--dataset", required=True, help="faireval, topical_chat, or a .jsonl/.csv file of your own")
    p.add_argument("--format", choices=["pairwise", "pointwise"],
                   help="the format of a custom file (default: the evaluator's task)")
    p.add_argument("--columns", help="custom file: map fields to your columns, e.g. question=prompt,answer_1=a")
    p.add_argument("--label-map", metavar="VALUE=LABEL,...", help="custom file: map your label values to ours")
    p.add_argument("--probes", default="position,verbosity,authority,bandwagon,distraction",
                   help="comma-separated probes (default: all)")
    p.add_argument("--seed", type=int, default=0, help="perturbation seed (template variants, seeded targets)")
    p.add_argument("--limit", type=int, help="audit only the first N items")
    p.add_argument("--out", default="reports/audit", help="folder of perturbations and results (default "
                                                          "reports/audit); a rerun resumes it")
    p.add_argument("--family-columns", metavar="COL1,COL2",
                   help="columns naming each answer's model family: adds self-preference")
    p.add_argument("--judge-family", help="the judge's own model family (default: from its model's name)")
    p.add_argument("--bias-column", metavar="COLUMN",
                   help="column naming each pair's bias type (EvalBiasBench format): adds accuracy per type")
    flags.add_lm_flags(p, loaded=True)
    flags.add_tracking_flags(p)


def run(args) -> int:
    from chateval_dspy.data.loaders import parse_columns, parse_label_map
    from chateval_dspy.data.spec import DataSpec
    from optim.audit.saved import audit_saved, certify_audit, log_audit

    data = DataSpec(dataset=args.dataset, format=args.format, columns=parse_columns(args.columns),
                    label_map=parse_label_map(args.label_map), limit=args.limit)
    report = audit_saved(args.program, data, out=args.out, probes=flags.names(args.probes), seed=args.seed,
                         lm=flags.lm_spec(args), concurrency=flags.concurrency(args),
                         family_columns=flags.names(args.family_columns),
                         bias_column=args.bias_column, judge_family=args.judge_family)
    if report.resumed:
        print(f"resumed: {report.resumed} verdict(s) were already in {report.out}", file=sys.stderr)
    print("\n".join(report.lines()))
    certificate = certify_audit(args.program, report)
    if certificate is not None:
        print(f"certificate: the audit is in {args.program}/card.json and card.md", file=sys.stderr)
    if not args.no_mlflow:
        print(f"mlflow run: {log_audit(report, uri=args.tracking_uri, certificate=certificate, program=args.program)}")
    return 0
