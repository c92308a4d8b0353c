"""Production use of a saved evaluator: ``load`` once, then judge items one by one or in batches.

``load`` accepts a saved evaluator directory, an MLflow run URI (``runs:/<run_id>[/evaluator]``, or
``runs:/<run_id>/pyfunc`` for the pyfunc model, whose artifacts hold the evaluator directory) or a
registered model (``models:/<name>/<version>``, ``models:/<name>/latest``, ``models:/<name>@<alias>``).
Plain JSON state is the default, checked against ``chateval_dspy.limits`` (see ``store``); a pickled
program is refused unless the caller passes ``trust_pickle=True``. The LM is chosen here, at load time
(the card's model *name* by default), and never read from the files.
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
import yaml

import chateval_dspy.limits as limits
from chateval_dspy.concurrency import bounded_unordered
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import item_from_record
from chateval_dspy.deploy.store import CARD_FILE, load_program, read_card
from chateval_dspy.errors import ChatEvalError, ConfigError, DataError
from chateval_dspy.lm import resolve
from chateval_dspy.lm.adapter import JudgeAdapter
from chateval_dspy.lm.resolve import EMBEDDED, EMBEDDED_MODEL_ID, configure_cache
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.run.evaluate import judge_item

log = logging.getLogger(__name__)
NESTED_COLUMNS = ("scores", "rationales", "referees", "truncated", "criteria", "empty")


@dataclass(frozen=True)
class Verdict:
    """The panel's judgement of one item.

    ``winner`` is ``"1"``, ``"2"``, ``"tie"`` or None (pairwise; None when every referee abstained);
    ``scores`` holds each response's combined score, keyed by the response (``answer_1``/``answer_2``:
    its mean over the task's ``preference.combine`` criteria, what ``aggregate=mean`` compares), or
    (pointwise) one score or label per criterion; ``criteria`` holds every criterion's panel value, keyed
    by criterion (pairwise: then by response); ``rationales`` maps each referee to its verdict's evidence,
    one per answer order; ``empty`` lists the judged responses that were empty.
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
                   empty=record.get("empty") or [])

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
    model = card.get("model") or ""
    if model == EMBEDDED_MODEL_ID:
        return EMBEDDED
    if model.startswith("openai-compatible/") or not model:
        raise ConfigError(f"this evaluator was compiled for {model or 'an unknown model'!r}, which cannot be reached "
                          "from its name alone: pass model= (a base URL or LiteLLM model string)")
    return model


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
    with open(mlmodel, "rb") as f:
        text = f.read(limits.MAX_MLMODEL_FILE_BYTES + 1)
    if len(text) > limits.MAX_MLMODEL_FILE_BYTES:
        raise ConfigError(f"{mlmodel} is larger than {limits.MAX_MLMODEL_FILE_BYTES} bytes "
                          "(limits.MAX_MLMODEL_FILE_BYTES)")
    try:
        flavors = (yaml.safe_load(text) or {}).get("flavors") or {}
        relative = flavors["python_function"]["artifacts"]["evaluator"]["path"]
    except (yaml.YAMLError, AttributeError, KeyError, TypeError):
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

    def __init__(self, program: ChatEval, card: dict, lm: dspy.LM, stack: contextlib.ExitStack):
        self.program, self.card, self.lm = program, card, lm
        self.config = program.config
        self._stack = stack

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

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path_or_uri: str | Path, *, model: str | None = None, trust_pickle: bool = False, slots: int = 4,
         timeout: float = 120.0, served_model: str | None = None, cache: bool = True) -> Judge:
    """Load a saved evaluator and bind it to an LM.

    Args:
        path_or_uri: A saved evaluator directory, ``runs:/<run_id>[/path]`` (``/pyfunc`` too), or
            ``models:/<name>/<version>``, ``models:/<name>/latest``, ``models:/<name>@<alias>``.
        model: The LM spec (``embedded``, a base URL, a LiteLLM string); default: the card's model,
            which is only ever a model name (a card naming a URL or settings is refused).
        trust_pickle: Allow loading a pickled program (runs code from the file). Off by default.
        slots: Requests kept in flight at once (the embedded model is laid out for them).
        timeout: Seconds per LM request.
        served_model: The model id at a base URL.
        cache: DSPy's LM cache in ``$CHATEVAL_CACHE_DIR`` (default ``~/.cache/chateval-dspy``), or off.
            The cache is process-wide, so this sets it for the whole process.
    """
    stack = contextlib.ExitStack()
    try:
        source = str(path_or_uri)
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
            program, card = _trusted(found), {"model": None, "config": found.config.to_dict()}
        else:
            _check_version(read_card(found), str(found / CARD_FILE))
            program, card = load_program(found)
        spec = model or _default_model(card)
        configure_cache(cache)
        # Looked up at call time, like every LM entry point, so one patch of resolve_lm reaches them all.
        lm = stack.enter_context(resolve.resolve_lm(spec, slots=slots, timeout=timeout, served_model=served_model))
        if card.get("model") and lm.model != card["model"]:
            warnings.warn(f"this evaluator was compiled for {card['model']} and now runs on {lm.model}: its instructions "
                          "and demonstrations were tuned for another model, so its agreement figures may not hold",
                          UserWarning, stacklevel=2)
        return Judge(program, card, lm, stack)
    except BaseException:
        stack.close()
        raise


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
