"""Production use of a saved evaluator: ``load`` once, then judge items one by one or in batches.

``load`` accepts a saved evaluator directory, an MLflow run URI (``runs:/<run_id>[/evaluator]``, or
``runs:/<run_id>/pyfunc`` for the pyfunc model, whose artifacts hold the evaluator directory) or a
registered model (``models:/<name>/<version>``, ``models:/<name>/latest``, ``models:/<name>@<alias>``).
Plain JSON state is the default, checked against ``chateval_dspy.limits`` (see ``store``); a pickled
program is refused unless the caller passes ``trust_pickle=True``. The LM is chosen here, at load time
(the card's model *name* by default), and never read from the files.

A mixed panel's card names each referee's model too (``referee_models``). The rule: ``load(path)`` runs every
referee on its card name (a LiteLLM string or ``embedded``); ``model=`` overrides the whole panel with one LM;
``referee_models={slug: spec}`` rebinds those referees (a URL, a LiteLLM string, ``embedded``), the others
following ``model=`` if given, else their card names. A card name ``openai-compatible/<id>`` (a base URL's LM)
cannot be reached from the name: such a referee needs ``referee_models=`` (or ``model=``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from statistics import fmean

import dspy
import pandas as pd

import chateval_dspy.limits as limits
from chateval_dspy.concurrency import bounded_unordered
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import item_from_record
from chateval_dspy.deploy.store import CARD_FILE, load_program, read_card, save_program
from chateval_dspy.errors import ChatEvalError, ConfigError, DataError
from chateval_dspy.lm.adapter import JudgeAdapter
from chateval_dspy.lm.batch.setup import BATCH_PREFIX, BatchRun
from chateval_dspy.lm.panel import open_panel
from chateval_dspy.lm.pricing import attach_price
from chateval_dspy.lm.resolve import EMBEDDED, EMBEDDED_MODEL_ID, configure_cache
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.run.evaluate import judge_item

log = logging.getLogger(__name__)
NESTED_COLUMNS = ("scores", "rationales", "referees", "truncated", "criteria", "empty", "usage_by_model")


@dataclass(frozen=True)
class Verdict:
    """The panel's judgement of one item.

    ``winner`` is ``"1"``, ``"2"``, ``"tie"`` or None (pairwise; None when every referee abstained);
    ``scores`` holds each response's combined score, keyed by the response (``answer_1``/``answer_2``:
    its mean over the task's ``preference.combine`` criteria, what ``aggregate=mean`` compares), or
    (pointwise) one score or label per criterion; ``criteria`` holds every criterion's panel value, keyed
    by criterion (pairwise: then by response); ``rationales`` maps each referee to its verdict's evidence,
    one per answer order; ``empty`` lists the judged responses that were empty. ``cost_usd`` is what the item
    cost in US dollars (None: some model used is unpriced); ``usage_by_model`` holds calls, tokens, seconds
    and dollars per model.
    """

    id: str
    format: str
    winner: str | None
    scores: dict[str, float] | None
    rationales: dict[str, list[str]]
    referees: dict[str, list]
    consistent: bool | None
    abstained: str | None
    calls: int | None
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    truncated: dict[str, int] = field(default_factory=dict)
    criteria: dict | None = None
    empty: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    usage_by_model: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict, task: TaskSpec | str | None = None) -> Verdict:
        """The verdict a results line records, read with its task (default: the built-in task of its format)."""
        task = as_task(task or record["format"])
        pairwise = task.format == "pairwise"
        rationales: dict[str, list[str]] = {}
        for transcript in record.get("transcripts") or []:
            for u in transcript:
                if u["kind"] == "verdict":
                    rationales.setdefault(u["speaker"], []).append(u["text"])
        if pairwise:
            given = all(record.get(f) is not None for f in task.output_fields)
            criteria = {c.name: {r: record[f"{c.name}_{n}"] for n, r in enumerate(task.responses, start=1)}
                        for c in task.criteria} if given else None
            combine = task.preference.combine
            scores = {r: fmean(record[f"{c}_{n}"] for c in combine) for n, r in enumerate(task.responses, start=1)} \
                if given and combine else None
        else:
            scores = criteria = record["prediction"]
        return cls(id=record["id"], format=record["format"], winner=record["prediction"] if pairwise else None,
                   scores=scores, rationales=rationales, referees=record.get("referees") or {},
                   consistent=record.get("consistent"), abstained=record.get("abstained"), calls=record.get("calls"),
                   prompt_tokens=record["prompt_tokens"], completion_tokens=record["completion_tokens"],
                   seconds=record["seconds"], truncated=record.get("truncated") or {}, criteria=criteria,
                   empty=record.get("empty") or [], cost_usd=record.get("cost_usd"),
                   usage_by_model=record.get("usage_by_model") or {})

    def to_dict(self) -> dict:
        return asdict(self)


def _check_version(card: dict, source: str) -> None:
    versions = card.get("versions")
    wrote = versions.get("chateval-dspy") if isinstance(versions, dict) else None
    try:
        ours = metadata.version("chateval-dspy")
    except metadata.PackageNotFoundError:
        return
    if isinstance(wrote, str) and wrote.split(".")[0] != ours.split(".")[0]:
        raise ConfigError(f"{source} was written by chateval-dspy {wrote[:40]}; this is {ours}. "
                          f"Install chateval-dspy=={wrote[:40]} to use it")


def _default_model(card: dict) -> str:
    return _spec_for_name(card.get("model") or "", "this evaluator", "model= (a base URL or LiteLLM model string)")


def _spec_for_name(model: str, who: str, how: str) -> str:
    """The LM spec a card's model *name* stands for, or a ConfigError saying how to give the endpoint."""
    if model == EMBEDDED_MODEL_ID:
        return EMBEDDED
    if model.startswith("openai-compatible/") or not model:
        raise ConfigError(f"{who} was compiled for {model or 'an unknown model'!r}, which cannot be reached "
                          f"from its name alone: pass {how}")
    return model


def referee_specs(card: dict, roles, *, model: str | None, referee_models: dict[str, str] | None) -> dict[str, str]:
    """``{slug: spec}`` of the referees that run on an LM of their own (the rule in the module's docstring).

    Example:
        >>> card = {"model": "openai/gpt-4o-mini", "referee_models": {"critic": "openai/gpt-4o"}}
        >>> referee_specs(card, ("critic", "scientist"), model=None, referee_models=None)
        {'critic': 'openai/gpt-4o'}
        >>> referee_specs(card, ("critic", "scientist"), model="http://h:8000/v1", referee_models=None)
        {}
        >>> referee_specs(card, ("critic", "scientist"), model=None, referee_models={"scientist": "embedded"})
        {'critic': 'openai/gpt-4o', 'scientist': 'embedded'}
    """
    from chateval_dspy.lm.panel import check_panel, check_referee_models

    given = dict(check_referee_models(referee_models or {}))
    check_panel(given, roles)
    out = {} if model is not None else {
        slug: _spec_for_name(name, f"referee {slug!r}", f"referee_models={{{slug!r}: URL}} (or model= for the "
                             "whole panel)")
        for slug, name in (card.get("referee_models") or {}).items() if slug not in given}
    return {**out, **given}


def _from_mlflow(uri: str, workdir: Path, trust_pickle: bool) -> Path | ChatEval:
    """A local evaluator directory for an MLflow URI, or (trusted only) the unpickled dspy model."""
    try:
        return _fetch_from_mlflow(uri, workdir, trust_pickle)
    except ChatEvalError:
        raise
    except Exception as exc:  # MlflowException, and whatever a tracking or artifact store raises
        raise ConfigError(f"cannot load {uri} from MLflow ({type(exc).__name__}: {str(exc)[:300]})") from exc


def _fetch_from_mlflow(uri: str, workdir: Path, trust_pickle: bool) -> Path | ChatEval:
    import mlflow  # only this branch needs MLflow

    def download(artifact_uri: str, into: str) -> Path:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri, dst_path=str(workdir / into)))

    if uri.startswith("models:/"):
        run_id, model_uri = _registered_model(uri)
        if run_id:
            try:  # the run that logged the model also logged the evaluator as plain JSON: prefer it
                return download(f"runs:/{run_id}/evaluator", "run")
            except Exception:  # noqa: BLE001 - no evaluator in that run: the model's own artifacts may hold one
                log.info("run %s has no 'evaluator/' artifact; reading the model %s itself", run_id, model_uri)
        return _evaluator_in(download(model_uri, "model"), model_uri, trust_pickle)
    run_id, _, sub = uri[len("runs:/"):].partition("/")
    sub = sub.strip("/") or "evaluator"
    if not run_id:
        raise ConfigError(f"{uri}: use runs:/<run_id>[/<artifact path>]")
    try:
        local = download(f"runs:/{run_id}/{sub}", "run")
    except Exception as exc:
        if sub == "evaluator":
            raise ConfigError(f"run {run_id} has no saved evaluator (artifact 'evaluator/'): {str(exc)[:300]}") from exc
        raise ConfigError(f"cannot fetch {uri}: {str(exc)[:300]}") from exc
    return _evaluator_in(local, uri, trust_pickle)


def _registered_model(uri: str) -> tuple[str | None, str]:
    """``(run_id, models:/<name>/<version>)`` for ``models:/<name>/<version|latest>`` or ``models:/<name>@<alias>``.

    A logged model's own URI (``models:/<model_id>``) has no registry entry: ``(None, uri)``.
    """
    import mlflow

    rest = uri[len("models:/"):].strip("/")
    client = mlflow.MlflowClient()
    if "/" in rest:
        name, version = rest.split("/", 1)
        if not name or not version or "/" in version:
            raise ConfigError(f"{uri}: use models:/<name>/<version>, models:/<name>/latest or models:/<name>@<alias>")
        if version.lower() == "latest":
            if "'" in name:
                raise ConfigError(f"{uri}: a model name with a quote cannot be looked up")
            found = client.search_model_versions(f"name='{name}'")
            if not found:
                raise ConfigError(f"{uri}: registered model {name!r} has no versions")
            mv = max(found, key=lambda v: int(v.version))
        else:
            mv = client.get_model_version(name, version)
    elif "@" in rest:
        name, alias = rest.split("@", 1)
        mv = client.get_model_version_by_alias(name, alias)
    elif rest:
        return None, uri
    else:
        raise ConfigError(f"{uri}: use models:/<name>/<version>, models:/<name>/latest or models:/<name>@<alias>")
    return mv.run_id, f"models:/{mv.name}/{mv.version}"


def _evaluator_in(local: Path, uri: str, trust_pickle: bool) -> Path | ChatEval:
    """The evaluator directory inside downloaded MLflow artifacts: the directory itself, the JSON evaluator
    a pyfunc model carries as its ``evaluator`` artifact (read, never run), or else a pickled dspy model."""
    if (local / CARD_FILE).is_file():
        return local
    mlmodel = local / "MLmodel"
    if not mlmodel.is_file():
        raise ConfigError(f"{uri} holds neither a saved evaluator ({CARD_FILE}) nor an MLflow model")
    text = limits.read_bounded(mlmodel, limits.MAX_MLMODEL_FILE_BYTES, "limits.MAX_MLMODEL_FILE_BYTES", "MLmodel file")
    try:  # the bounded loader: the MLmodel file comes from an artifact store, as untrusted as any file
        flavors = (limits.parse_yaml(text if isinstance(text, str) else text.decode("utf-8", "replace"),
                                     f"{uri} MLmodel") or {}).get("flavors") or {}
        relative = flavors["python_function"]["artifacts"]["evaluator"]["path"]
    except (ConfigError, AttributeError, KeyError, TypeError):
        relative = None
    if isinstance(relative, str):
        inside = (local / relative).resolve()
        # the MLmodel file is data from the artifact store: it must not point outside the download
        if inside.is_relative_to(local.resolve()) and (inside / CARD_FILE).is_file():
            return inside
        raise ConfigError(f"{uri}: the pyfunc model's 'evaluator' artifact ({relative[:200]!r}) is not a saved "
                          "evaluator inside the model")
    if isinstance(flavors, dict) and "dspy" in flavors:
        return _unpickle(uri, trust_pickle)
    raise ConfigError(f"{uri} is an MLflow model but not a chateval-dspy evaluator (flavors: "
                      f"{', '.join(map(str, flavors)) if isinstance(flavors, dict) else '?'})")


def _refuse_pickle(source, trust_pickle: bool) -> None:
    if not trust_pickle:
        raise ConfigError(f"{source} is a pickled program: loading it can run arbitrary code. "
                          "Pass trust_pickle=True (CLI: --trust-pickle) only for files you trust")


def _unpickle(uri: str, trust_pickle: bool) -> ChatEval:
    _refuse_pickle(uri, trust_pickle)
    import os

    import mlflow

    previous = os.environ.get("MLFLOW_ALLOW_PICKLE_DESERIALIZATION")
    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "true"  # the caller trusts this one model only
    try:
        return mlflow.dspy.load_model(uri)
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", None)
        else:
            os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = previous


class Judge:
    """A loaded evaluator bound to an LM. Use as a context manager, or call ``close()``.

    Example:
        >>> with load("programs/faireval-bootstrap") as judge:  # doctest: +SKIP
        ...     v = judge({"question": "...", "answer_1": "...", "answer_2": "..."})
        ...     v.winner, v.scores, v.rationales
    """

    def __init__(self, program: ChatEval, card: dict, lm: dspy.LM, stack: contextlib.ExitStack,
                 referee_lms: dict[str, dspy.LM] | None = None):
        self.program, self.card, self.lm = program, card, lm
        self.config = program.config
        self.referee_lms = dict(referee_lms or {})  # a mixed panel: role slug -> the LM its predictors are bound to
        self._stack = stack
        bind_referees(program, self.referee_lms)

    @property
    def format(self) -> str:
        return self.config.format

    @property
    def task(self) -> TaskSpec:
        """The task this evaluator judges (its items' fields, criteria and scales)."""
        return self.config.task_spec

    def __call__(self, item: dict, *, row: int | None = None, source: str = "item") -> Verdict:
        """Judge one item (a dict with the task's input fields; ``id`` optional)."""
        example = item_from_record(item, self.task, source=source, row=row)
        with dspy.context(lm=self.lm, adapter=JudgeAdapter()):
            return Verdict.from_record(judge_item(self.program, example, self.config), self.task)

    def evaluate_batch(self, items, *, concurrency: int = 4, flat: bool = False) -> pd.DataFrame:
        """Judge many items (a DataFrame or records) with at most ``concurrency`` in flight.

        Returns a DataFrame in input order with one row per item; an invalid row gets its
        error in the ``error`` column and the batch goes on. ``flat=True`` turns the nested
        columns (scores, rationales, referees, truncated) into JSON text, for Arrow-based
        engines (Ray, Spark, MLflow serving).
        """
        records = items.to_dict("records") if isinstance(items, pd.DataFrame) else list(items)

        def one(indexed):
            i, record = indexed
            try:
                return {**self(record, row=i + 1, source="batch").to_dict(), "error": None}
            except DataError as exc:
                return {"id": str(record.get("id", i + 1)) if isinstance(record, dict) else str(i + 1), "error": str(exc)}

        out = [None] * len(records)
        for (i, _), verdict in bounded_unordered(one, list(enumerate(records)), concurrency):
            out[i] = verdict
        frame = pd.DataFrame(out)
        if flat:
            for column in NESTED_COLUMNS:
                if column in frame:
                    frame[column] = frame[column].map(lambda v: None if v is None else json.dumps(v, default=str))
        return frame

    def with_program(self, program: ChatEval, card: dict | None = None) -> Judge:
        """A judge of ``program`` (a tuned copy of this one's) on this judge's LM, which stays this judge's to close.

        ``card`` replaces this judge's card (its config must still describe ``program``).
        """
        if program.config != self.config:
            raise ConfigError("with_program: the program's panel differs from this judge's; load its own evaluator")
        return Judge(program, dict(card or self.card), self.lm, contextlib.ExitStack(), referee_lms=self.referee_lms)

    def save(self, directory: str | Path) -> Path:
        """Save this judge's program and card as an evaluator directory (``load`` reads it back)."""
        return save_program(self.program, directory, self.card)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bind_referees(program: ChatEval, lms: dict[str, dspy.LM]) -> None:
    """Bind each referee's ``argue`` and ``judge`` predictors to its LM (a loaded program, never saved again).

    Binding the predictors themselves makes the panel mixed wherever the program runs, inside any caller's
    DSPy context; the summarizer and the other referees keep the context's LM.
    """
    for slug, lm in lms.items():
        referee = program.debate.referees[slug]
        referee.argue.lm = referee.judge.lm = lm


def load(path_or_uri: str | Path, *, model: str | None = None, trust_pickle: bool = False, slots: int = 4,
         timeout: float = 120.0, served_model: str | None = None, cache: bool = True,
         referee_models: dict[str, str] | None = None, price_per_mtok: str | tuple[float, ...] | None = None,
         batch: BatchRun | None = None) -> Judge:
    """Load a saved evaluator and bind it to an LM (a mixed panel: each referee to its own).

    Args:
        path_or_uri: A saved evaluator directory, ``runs:/<run_id>[/path]`` (``/pyfunc`` too), or
            ``models:/<name>/<version>``, ``models:/<name>/latest``, ``models:/<name>@<alias>``.
        model: The LM spec (``embedded``, a base URL, a LiteLLM string); default: the card's model,
            which is only ever a model name (a card naming a URL or settings is refused). Given, it runs the
            whole panel, referees the card assigns to other models included (unless ``referee_models`` says).
        trust_pickle: Allow loading a pickled program (runs code from the file). Off by default.
        slots: Requests kept in flight at once (the embedded model is laid out for them).
        timeout: Seconds per LM request.
        served_model: The model id at a base URL.
        cache: DSPy's LM cache in ``$CHATEVAL_CACHE_DIR`` (default ``~/.cache/chateval-dspy``), or off.
            The cache is process-wide, so this sets it for the whole process.
        referee_models: ``{role slug: spec}``: those referees run on their own LM (a base URL, a LiteLLM string,
            ``embedded``); default: the card's ``referee_models`` names (see the module's docstring for the rule).
        price_per_mtok: US dollars per million input and output tokens of the main model (``"0.15,0.6"``, optionally
            with the cached-read and cache-write rates: ``"0.15,0.6,0.075"``), for an endpoint LiteLLM's cost map
            does not price; verdicts then carry ``cost_usd``.
        batch: Batch mode (``lm.batch``): the model's calls go out in waves through its Batch API (or a folder);
            judge items with ``score_file(..., waves=True)``. A mixed panel is not batched.

    Example:
        >>> from chateval_dspy.deploy.store import make_card, save_program
        >>> from chateval_dspy.program.chateval import build_evaluator
        >>> program = build_evaluator(DebateConfig(roles=("critic", "scientist"), turns=1, calibrate=False))
        >>> _ = save_program(program, tmp / "mixed", make_card(
        ...     program, model="openai-compatible/fake-served", referee_models={"scientist": "openai/gpt-4o-mini"}))
        >>> with load(tmp / "mixed", model=fake_url, referee_models={"scientist": fake_url}, cache=False) as judge:
        ...     v = judge({"question": "2+2?", "answer_1": "4", "answer_2": "5"})
        >>> sorted(judge.referee_lms), list(v.usage_by_model), v.cost_usd is None
        (['scientist'], ['openai-compatible/fake-served'], True)
    """
    stack = contextlib.ExitStack()
    try:
        program, card = _saved(str(path_or_uri), trust_pickle, stack)
        roles = tuple(program.config.roles)
        spec = model or _default_model(card)
        referees = referee_specs(card, roles, model=model, referee_models=referee_models)
        price = LMSpec(spec, price_per_mtok=price_per_mtok).price()  # a bad price fails before any model starts
        configure_cache(cache)
        if batch is not None:
            lm, referee_lms = stack.enter_context(LMSpec(
                spec, served_model=served_model, price_per_mtok=price_per_mtok, referee_models=referees, batch=True,
                batch_dir=batch.batch_dir, batch_poll=batch.poll).batching(batch.journal, batch.on_wave)), {}
        else:
            lm, referee_lms = stack.enter_context(open_panel(spec, referees, slots=slots, timeout=timeout,
                                                             served_model=served_model))
            attach_price(lm, price)  # a batching LM carries its batch price already
        _warn_if_moved(card, lm, referee_lms, roles)
        return Judge(program, card, lm, stack, referee_lms)
    except BaseException:
        stack.close()
        raise


def _saved(source: str, trust_pickle: bool, stack: contextlib.ExitStack) -> tuple[ChatEval, dict]:
    """The program and card at ``source``: a directory, a pickle (if trusted) or an MLflow URI (fetched into a
    temporary directory that ``stack`` removes)."""
    if source.startswith(("runs:/", "models:/")):
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chateval-load-")))
        found = _from_mlflow(source, workdir, trust_pickle)
    else:
        found = Path(source)
        if found.is_file() and found.suffix in (".pkl", ".pickle"):
            found = _unpickle_file(found, trust_pickle)
        elif found.is_dir() and not (found / CARD_FILE).exists() and (found / "program.pkl").exists():
            found = _unpickle_file(found, trust_pickle)
    if isinstance(found, ChatEval):
        return _trusted(found), {"model": None, "config": found.config.to_dict()}
    _check_version(read_card(found), str(found / CARD_FILE))
    return load_program(found)


def _warn_if_moved(card: dict, lm: dspy.LM, referee_lms: dict[str, dspy.LM], roles) -> None:
    """Warn about every referee (and the main LM) that now runs on another model than the card's."""
    compiled = card.get("model")
    if compiled and lm.model.removeprefix(BATCH_PREFIX) != compiled:  # batched, it is still the same model
        warnings.warn(f"this evaluator was compiled for {compiled} and now runs on {lm.model}: its instructions "
                      "and demonstrations were tuned for another model, so its agreement figures may not hold",
                      UserWarning, stacklevel=3)
    named = card.get("referee_models") or {}
    moved = {slug: (named.get(slug) or compiled, (referee_lms.get(slug) or lm).model) for slug in roles}
    moved = {slug: pair for slug, pair in moved.items() if pair[0] and pair[0] != pair[1] and slug in named}
    if moved:
        warnings.warn("referee(s) compiled for another model now run on: " + ", ".join(
            f"{slug} {was} -> {now}" for slug, (was, now) in moved.items()), UserWarning, stacklevel=3)


def _trusted(program: ChatEval) -> ChatEval:
    """A trusted, unpickled program held to the same limits and bound to no LM of its own.

    Unpickling skips ``DebateConfig``'s checks, and a pickle can carry predictor LMs and call settings;
    the caller trusted the code, not an LM or a budget chosen by whoever wrote it.
    """
    DebateConfig.from_dict(program.config.to_dict())
    for name, predictor in program.named_predictors():
        if predictor.lm is not None or predictor.config:
            log.warning("%s: dropping the LM and call settings the pickled program carried", name)
        predictor.lm, predictor.config = None, {}
    return program


def _unpickle_file(path: Path, trust_pickle: bool) -> ChatEval:
    _refuse_pickle(path, trust_pickle)
    program = dspy.load(str(path), allow_pickle=True)
    if not isinstance(program, ChatEval):
        raise ConfigError(f"{path} holds a {type(program).__name__}, not a chateval-dspy evaluator")
    return program
