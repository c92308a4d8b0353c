"""Flags shared by the commands, and their translation into the frozen specs the library takes.

Defaults and choices come from the dataclasses (``DebateConfig``, ``LMSpec``, ``DataSpec``), so a
flag can never drift from the Python API's default. Nothing here does work: it parses. The modules imported at
the top are light (no DSPy, LiteLLM or pandas): ``chateval --help`` builds every parser from them.
"""

from __future__ import annotations

import argparse
import dataclasses

from chateval_dspy.config import AGGREGATES, DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.data.splits import SPLITS
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec


def default(cls, name: str):
    """The dataclass field's default (what the Python API does when the flag is absent)."""
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


def add_data_flags(p: argparse.ArgumentParser, *, dataset_required: bool = True) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--dataset", required=dataset_required,
                   help="faireval, topical_chat, or a .jsonl/.csv file of your own")
    g.add_argument("--task", help="what is judged: a task file (.yaml/.json: inputs, criteria and scales, "
                                  "instructions) or a built-in task (faireval, topical_chat); sets the format")
    g.add_argument("--format", choices=["pairwise", "pointwise"],
                   help="the format of a custom file without --task (its built-in task's fields)")
    g.add_argument("--columns", help="custom file: map fields to your columns, e.g. question=prompt,answer_1=a,label=winner "
                                     "(with --task: its inputs, id, and label or each criterion)")
    g.add_argument("--skip-bad-rows", action="store_true",
                   help="custom file: skip malformed rows (unreadable JSON, a missing input, a label off its scale), "
                        "count and list them, instead of stopping")
    g.add_argument("--label-map", metavar="VALUE=LABEL,...",
                   help="custom file: map your label values to ours, e.g. 0=tie,A=1,B=2 (pairwise: 1, 2, tie; "
                        "pointwise: a criterion's scale); over the task's label_map. A map that makes two of the "
                        "file's values one label (1=2 in a file that also holds 2) stops the load, naming them")
    g.add_argument("--label-map-merge", action="store_true",
                   help="custom file: --label-map (or the task's label_map) may make two of the file's values one "
                        "label; say so when it is meant")
    g.add_argument("--group-by", metavar="COLUMN",
                   help="custom file, pointwise: each row's document id; adds summary-level correlations (per "
                        "document, averaged over the documents) beside the pooled ones")
    g.add_argument("--system", metavar="COLUMN",
                   help="custom file, pointwise: each row's system id; adds system-level correlations (of the "
                        "per-system mean scores)")
    g.add_argument("--unlabelled", metavar="CRITERION,...",
                   help="custom file, pointwise: criteria it does not rate (otherwise a criterion's label column "
                        "that no row has is an error while the file has other label columns)")
    g.add_argument("--split", default=default(DataSpec, "split"), choices=["all", *SPLITS])
    g.add_argument("--seed", type=int, default=default(DataSpec, "seed"), help="split and bootstrap seed")
    g.add_argument("--resamples", type=int, default=default(DataSpec, "resamples"), metavar="N",
                   help="bootstrap resamples behind each confidence interval (default 2000; fewer: quicker, rougher)")
    g.add_argument("--limit", type=int, help="judge only the first N items of the split")


def add_panel_flags(p: argparse.ArgumentParser) -> None:
    from chateval_dspy.program.strategies import STRATEGIES

    g = p.add_argument_group("panel")
    who = g.add_mutually_exclusive_group()
    who.add_argument("--roles", type=int, metavar="N",
                     help=f"use the first N built-in personas (default {len(default(DebateConfig, 'roles'))})")
    who.add_argument("--role", action="append", metavar="SLUG", help="a persona by slug; repeat for more referees")
    who.add_argument("--same-role", type=int, metavar="N", help="N referees sharing one persona (the paper's ablation)")
    g.add_argument("--role-file", help="YAML/JSON file of extra personas (see chateval_dspy/program/roles/default.yaml)")
    g.add_argument("--strategy", default=default(DebateConfig, "strategy"), choices=list(STRATEGIES))
    g.add_argument("--turns", type=int, default=default(DebateConfig, "turns"),
                   help="rounds of talk; the last is the verdict (default %(default)s)")
    g.add_argument("--aggregate", default=default(DebateConfig, "aggregate"), choices=list(AGGREGATES))
    g.add_argument("--no-calibrate", action="store_true", help="pairwise: judge one answer order only")
    g.add_argument("--consensus-stop", action="store_true",
                   help="every round ends in scores; stop once all referees agree (fewer LM calls)")
    g.add_argument("--weighted-scores", action="store_true",
                   help="G-Eval style: expected score under the LM's token probabilities (needs an LM with logprobs)")
    g.add_argument("--parse-retries", type=int, default=default(DebateConfig, "parse_retries"))
    g.add_argument("--max-text-chars", type=int, default=default(DebateConfig, "max_text_chars"),
                   help="judged texts longer than this are truncated (default %(default)s)")


def add_lm_flags(p: argparse.ArgumentParser, *, concurrency: int = 1, loaded: bool = False) -> None:
    """The LM and its call settings, the same on every command (``lm_spec`` reads them); ``loaded``: a command that
    runs saved evaluators, whose ``--model`` defaults to each one's own (its card's)."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None if loaded else "embedded",
                   help="embedded (Gemma 3 270M, started for you), an OpenAI-compatible base URL, or a LiteLLM model "
                        "string such as openai/gpt-4o-mini (default: "
                        + ("the saved evaluator's own model, its card's)" if loaded else "embedded)"))
    g.add_argument("--served-model", help="model id at a base URL (default: the first it lists)")
    g.add_argument("--referee", action="append", metavar="SLUG=MODEL",
                   help="a mixed panel: referee SLUG runs on MODEL (embedded, a base URL, a LiteLLM string), the "
                        "summarizer and other referees on --model; repeat per referee, e.g. "
                        "--referee critic=openai/gpt-4o-mini --referee scientist=http://host:8000/v1")
    g.add_argument("--price-per-mtok", metavar="IN,OUT[,CACHED_READ[,CACHE_WRITE]]",
                   help="US dollars per million input,output tokens of --model (e.g. 0.15,0.6), and optionally per "
                        "million prompt tokens read from and written to the provider's prompt cache, for an endpoint "
                        "LiteLLM's cost map does not price; without it such a model's cost is 'unpriced'")
    g.add_argument("--temperature", type=float, default=default(LMSpec, "temperature"))
    g.add_argument("--max-tokens", type=int)
    g.add_argument("--timeout", type=float, default=default(LMSpec, "timeout"),
                   help="seconds one attempt of one LM request may take (default %(default)s)")
    g.add_argument("--retries", type=int, default=default(LMSpec, "retries"),
                   help="further attempts after a transient LM failure (default %(default)s)")
    g.add_argument("--call-deadline", type=float,
                   help="seconds one LM call may take, all attempts and backoff together (default 2 x timeout + 10)")
    g.add_argument("--item-deadline", type=float,
                   help="seconds all LM calls of one item may take (default 4 x call deadline)")
    g.add_argument("--breaker", type=int, metavar="N", default=default(LMSpec, "breaker"),
                   help="stop the run after N failed LM attempts in a row against one endpoint (timeouts, refused or "
                        "lost connections), keeping finished results; rerun to resume (default %(default)s)")
    g.add_argument("--rate-limit-wait", type=float, metavar="SECONDS", default=default(LMSpec, "rate_limit_wait"),
                   help="seconds an endpoint may answer 429 in a row (Retry-After honoured, at most 60 s a wait) before "
                        "the run stops, the rate-limited items unrecorded; rerun to resume (default %(default)s)")
    g.add_argument("--concurrency", type=int, default=concurrency, help="items judged at once (default %(default)s)")
    g.add_argument("--no-cache", action="store_true", help="turn DSPy's LM cache off")
    g.add_argument("--cache-dir", help="DSPy cache directory (default: $CHATEVAL_CACHE_DIR or ~/.cache/chateval-dspy)")


def add_batch_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batch mode")
    g.add_argument("--batch", action="store_true",
                   help="judge through the provider's Batch API (openai/..., anthropic/..., a base URL with "
                        "/v1/batches), in waves: half price, answers within hours; a rerun attaches to the batches "
                        "already submitted (kept beside --out in <out>.batches/)")
    g.add_argument("--batch-dir", metavar="DIR",
                   help="batch mode for a self-hosted engine: write each wave's requests to DIR in the OpenAI batch "
                        "format vllm run-batch reads, and read its output file back (implies --batch)")
    g.add_argument("--batch-poll", type=float, default=default(LMSpec, "batch_poll"),
                   help="seconds between looks at a submitted batch (default %(default)s)")


def add_common_flags(p: argparse.ArgumentParser, *, dataset_required: bool = True) -> None:
    """Data, panel and model flags, shared by every command that judges a dataset."""
    add_data_flags(p, dataset_required=dataset_required)
    add_panel_flags(p)
    add_lm_flags(p)


def add_tracking_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tracking")
    g.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite under ./mlruns)")
    g.add_argument("--no-mlflow", action="store_true", help="do not log this run to MLflow")


def add_model_flags(g, what: str) -> None:
    """``--no-log-model``, ``--register`` and ``--wheelhouse`` (compile, search): ``what`` names the program they log."""
    g.add_argument("--no-log-model", action="store_true",
                   help=f"do not log {what} as MLflow models (the pyfunc for serving and Spark, and the dspy flavour)")
    g.add_argument("--register", metavar="NAME",
                   help="register the pyfunc model (batch: serving, mlflow.pyfunc.spark_udf) under this name")
    g.add_argument("--wheelhouse", action="store_true",
                   help="put the wheels of the pyfunc model's whole environment in it (this platform and Python; "
                        "a few hundred MB), so that it installs where no package index is reachable")


def add_gate_flags(p: argparse.ArgumentParser) -> None:
    """Gates on the saved evaluator's certificate (compile, search): measured on it, then checked before it is
    registered."""
    g = p.add_argument_group("gates", "measured on the saved evaluator over the test split (the bias audit; the "
                                      "alternative annotator test against --people) into its certificate (card.json, "
                                      "card.md), then checked before --register; a failing gate registers nothing and "
                                      "exits non-zero, listing every failing figure")
    g.add_argument("--require", action="append", default=[], choices=["replaces-annotator"],
                   help="replaces-annotator: the alternative annotator test says the panel can replace one of your "
                        "people on their labels of the test split's items (needs --people; repeatable)")
    g.add_argument("--max-position-flips", type=float, metavar="RATE",
                   help="the highest flip rate under swapped answers (the audit's, with the evaluator's calibration)")
    g.add_argument("--min-robustness", type=float, metavar="RATE",
                   help="the lowest robustness rate of each text probe (verbosity, authority, bandwagon, distraction)")
    g.add_argument("--people", metavar="SOURCE",
                   help="several people's labels for --require replaces-annotator: a .jsonl/.csv file (one column per "
                        "person with --annotators, else long: id,annotator,label) or mlflow:<experiment>")
    g.add_argument("--annotators", metavar="A1,A2,...", help="--people's per-person label columns")


def gates(args):
    """``--require``, ``--max-position-flips``, ``--min-robustness``, ``--people``, ``--annotators``
    -> ``Gates`` (the people's labels read: untrusted, checked by ``optim.certify.people``)."""
    from optim.certify.gates import Gates

    people = None
    if args.annotators and not args.people:
        raise ConfigError("--annotators names the label columns of --people FILE: pass --people too")
    if args.people:
        from optim.certify.people import read_people

        people = read_people(args.people, annotators=names(args.annotators),
                             tracking_uri=getattr(args, "tracking_uri", None))
    return Gates(require=tuple(args.require), max_position_flips=args.max_position_flips,
                 min_robustness=args.min_robustness, people=people)


def add_loaded_flags(p: argparse.ArgumentParser) -> None:
    """A saved evaluator and the LM it runs on (score, serve)."""
    p.add_argument("evaluator", help="saved evaluator dir, runs:/<run_id>[/path] or models:/<name>/<version>")
    p.add_argument("--trust-pickle", action="store_true", help="allow a pickled program (runs code from the file)")
    add_lm_flags(p, concurrency=2, loaded=True)


def add_held_out_flags(p: argparse.ArgumentParser) -> None:
    """The labelled items ``calibrate`` and ``cascade`` judge: the seeded split's test part (``--seed`` is theirs)."""
    p.add_argument("--dataset", required=True, help="faireval, topical_chat, or a labelled .jsonl/.csv file")
    p.add_argument("--columns", help="custom file: map fields to your columns, e.g. question=prompt,label=winner")
    p.add_argument("--label-map", metavar="VALUE=LABEL,...", help="custom file: map your label values to ours")
    p.add_argument("--label-map-merge", action="store_true",
                   help="custom file: --label-map may make two of the file's values one label; say so when it is meant")
    p.add_argument("--limit", type=int, help="use only the first N items of the test split")


def held_out_spec(args) -> DataSpec:
    """``add_held_out_flags``' items as a ``DataSpec``."""
    from chateval_dspy.data.loaders import parse_columns, parse_label_map

    return DataSpec(dataset=args.dataset, columns=parse_columns(args.columns), label_map=parse_label_map(args.label_map),
                    label_map_merge=args.label_map_merge, limit=args.limit)


def tracking_spec(args):
    """``--tracking-uri``, ``--no-mlflow``, ``--no-log-model``, ``--register``, ``--wheelhouse`` -> ``TrackingSpec``."""
    from optim.tracking.runs import TrackingSpec

    return TrackingSpec(enabled=not args.no_mlflow, uri=args.tracking_uri, log_model=not getattr(args, "no_log_model", False),
                        register=getattr(args, "register", None), wheelhouse=getattr(args, "wheelhouse", False))


def data_spec(args) -> DataSpec:
    from chateval_dspy.data.loaders import parse_columns, parse_label_map

    return DataSpec(dataset=args.dataset, format=args.format, columns=parse_columns(args.columns),
                    split=args.split or "all", seed=args.seed, limit=args.limit, task=task(args),
                    skip_bad_rows=getattr(args, "skip_bad_rows", False),
                    label_map=parse_label_map(getattr(args, "label_map", None)),
                    group_by=getattr(args, "group_by", None), system=getattr(args, "system", None),
                    unlabelled=names(getattr(args, "unlabelled", None)), resamples=getattr(args, "resamples", None),
                    label_map_merge=getattr(args, "label_map_merge", False))


def names(text: str | None) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")``: a comma-separated flag value."""
    return tuple(filter(None, (name.strip() for name in (text or "").split(","))))


def task(args):
    """``--task`` read and checked (a ``TaskSpec``), or None: the dataset's or format's built-in task."""
    from chateval_dspy.program.task import load_task

    name = getattr(args, "task", None)
    return load_task(name) if name else None


def lm_spec(args) -> LMSpec:
    from chateval_dspy.lm.panel import parse_referees

    batch = {}  # none for a command without the batch flags (serve parses --batch only to refuse it)
    if hasattr(args, "batch_poll"):
        batch = {"batch": args.batch, "batch_dir": args.batch_dir, "batch_poll": args.batch_poll}
    return LMSpec(model=args.model, served_model=args.served_model, temperature=args.temperature,
                  max_tokens=args.max_tokens, timeout=args.timeout, retries=args.retries,
                  call_deadline=args.call_deadline, item_deadline=args.item_deadline, breaker=args.breaker,
                  rate_limit_wait=getattr(args, "rate_limit_wait", default(LMSpec, "rate_limit_wait")),
                  cache=not args.no_cache, cache_dir=args.cache_dir,
                  referee_models=parse_referees(getattr(args, "referee", None)),
                  price_per_mtok=getattr(args, "price_per_mtok", None), **batch)


def panel_roles(args) -> tuple[str, ...]:
    """``--roles N`` / ``--role SLUG`` / ``--same-role N`` -> the role slugs."""
    from chateval_dspy.program.roles import first_roles, same_roles

    if args.same_role is not None:
        if args.same_role < 1:
            raise ConfigError(f"--same-role takes a positive number, got {args.same_role}")
        return same_roles(args.same_role)
    if args.role:
        return tuple(args.role)
    return first_roles(args.roles if args.roles is not None else len(default(DebateConfig, "roles")))


def debate_config(args, fmt: str, task) -> DebateConfig:
    """Flags -> DebateConfig (the CLI's only translation step for the panel); ``task``: ``--task`` as read once
    (``DataSpec.task`` from ``data_spec``), None for the format's built-in."""
    return DebateConfig(format=fmt, roles=panel_roles(args), strategy=args.strategy, turns=args.turns,
                        calibrate=not args.no_calibrate, aggregate=args.aggregate, parse_retries=args.parse_retries,
                        max_text_chars=args.max_text_chars, role_file=args.role_file,
                        consensus_stop=args.consensus_stop, weighted_scores=args.weighted_scores, task=task)


def concurrency(args) -> int:
    if args.concurrency < 1:
        raise ConfigError(f"--concurrency must be positive, got {args.concurrency}")
    return args.concurrency
