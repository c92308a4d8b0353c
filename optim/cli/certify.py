"""``chateval certify``: people against people, the panel beside each person, and the alternative annotator test
(``optim.certify``)."""

from __future__ import annotations

from optim.cli import flags


def add_command(sub) -> None:
    p = sub.add_parser("certify", help="agreement among several people per item, the panel's beside each person, and "
                                       "the alternative annotator test, each figure with its 95%% interval")
    p.add_argument("--results", metavar="RESULTS.jsonl",
                   help="the panel's results file (chateval evaluate/score) on the labelled items; without it, the "
                        "agreement among the people only")
    p.add_argument("--dataset", required=True, metavar="FILE",
                   help="people's labels: a .jsonl/.csv file, or mlflow:<experiment>[?filter=...] (review feedback)")
    p.add_argument("--annotators", metavar="A1,A2,...",
                   help="the file's per-person label columns; without it the file is long: one row per item and person")
    p.add_argument("--long-columns", default="id,annotator,label", metavar="ID,PERSON,LABEL",
                   help="a long file's columns (default id,annotator,label)")
    p.add_argument("--usr-aspect", metavar="ASPECT",
                   help="the file is the USR release (tc_usr_data.json): read this aspect, e.g. Overall")
    p.add_argument("--question", default="label", help="mlflow: the feedback name read (default label)")
    p.add_argument("--judged-only", action="store_true",
                   help="leave out labelled items the results do not hold (default: refuse ids that do not match)")
    p.add_argument("--criterion", help="scoring results: the criterion whose score is the panel's label")
    p.add_argument("--level", choices=["nominal", "ordinal", "interval"],
                   help="level of measurement (default: ordinal when every label is a number, else nominal)")
    p.add_argument("--annotator-kind", choices=["expert", "skilled", "crowd"],
                   help="the people, for the test's epsilon (paper: 0.2, 0.15, 0.1; default crowd, the strictest)")
    p.add_argument("--epsilon", type=float, help="the test's cost-benefit margin (overrides --annotator-kind)")
    p.add_argument("--resamples", type=int, help="bootstrap resamples per interval (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--tracking-uri", help="MLflow tracking URI for mlflow: labels, and the certificate's run")
    p.add_argument("--program", metavar="DIR",
                   help="the saved evaluator whose panel wrote --results: write these figures into its card's "
                        "certificate (card.json, card.md; replacing an earlier certify's) and log them to MLflow")
    p.add_argument("--no-mlflow", action="store_true", help="with --program: do not log the certificate to MLflow")


def run(args) -> int:
    from chateval_dspy.errors import ConfigError
    from optim.certify.people import read_people
    from optim.certify.report import certify

    columns = flags.names(args.long_columns)
    if len(columns) != 3:
        raise ConfigError(f"--long-columns takes three names (item id, person, label), got {args.long_columns!r}")
    people = read_people(args.dataset, annotators=flags.names(args.annotators), columns=columns,
                         question=args.question, usr_aspect=args.usr_aspect, tracking_uri=args.tracking_uri)
    cert = certify(args.results, people, criterion=args.criterion, level=args.level, epsilon=args.epsilon,
                   judged_only=args.judged_only, seed=args.seed, n_resamples=args.resamples,
                   **({"kind": args.annotator_kind} if args.annotator_kind else {}))
    print("\n".join(cert.lines()))
    if args.program:
        from optim.certify.certificate import fill, log_run, people_part

        certificate = fill(args.program, "people", people_part(cert))
        print(f"certificate: written into {args.program}/card.json and card.md")
        if not args.no_mlflow:
            params = {"dataset": args.dataset, "results": args.results, "level": cert.level, "seed": args.seed}
            print(f"mlflow run: {log_run(certificate, args.program, command='certify', params=params, uri=args.tracking_uri)}")
    return 0
