"""Production use of a saved evaluator: ``load`` once, then judge items one by one or in batches.

``load`` reads a saved evaluator directory or an MLflow URI (``fetch``); JSON state is checked against
``chateval_dspy.limits`` (``store``), a pickle is refused unless trusted (``pickled``). The LM is the caller's (the
card's model *name* by default), never read from the files; a mixed panel binds each referee by ``binding``'s rule.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from statistics import fmean

import dspy

from chateval_dspy.data.loaders import item_from_record
from chateval_dspy.deploy.saved.binding import default_model, referee_specs, warn_if_moved
from chateval_dspy.deploy.saved.cascade import CascadeJudge, is_cascade, read_cascade
from chateval_dspy.deploy.saved.fetch import MLFLOW_SCHEMES, from_mlflow
from chateval_dspy.deploy.saved.pickled import is_pickled, trusted, unpickle_file
from chateval_dspy.deploy.saved.store import CARD_FILE, load_program, read_card, save_program
from chateval_dspy.deploy.saved.verdicts import LoadedJudge
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.program.confidence import Calibration
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.run.evaluate import result_record

_NOT_GIVEN = object()  # a call without an item dict (None is an item, a malformed one, as in a batch)


@dataclass(frozen=True)
class Verdict:
    """The panel's judgement of one item.

    ``winner`` is ``"1"``, ``"2"``, ``"tie"`` or None (pairwise; None when every referee abstained); ``scores``
    holds each response's mean over the task's ``preference.combine`` criteria (pairwise) or one score or label per
    criterion (pointwise); ``criteria`` every criterion's panel value (pairwise: per response); ``rationales`` each
    referee's evidence, one per answer order; ``empty`` the judged responses that were empty. ``cost_usd`` is None
    when some model used is unpriced; ``usage_by_model`` holds calls, tokens, seconds and dollars per model.

    ``confidence`` (one figure, or one per criterion) is the probability that people agree when
    ``confidence_calibrated``, else ``raw_confidence`` again (it ranks verdicts, but is no probability). A verdict
    below the calibration's threshold is withheld: ``winner`` (pointwise: ``scores``) None, ``abstained``
    ``needs_person``, and ``withheld`` the panel's verdict, for the person who judges the item instead.

    A cascade's verdict (``deploy.saved.cascade``) names the ``stage`` that gave it (None when withheld) and the
    ``stages_run`` that judged the item, its figures summed over them; one evaluator's has None and [].
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
    confidence: float | dict[str, float] | None = None
    raw_confidence: float | dict[str, float] | None = None
    confidence_calibrated: bool = False
    withheld: str | dict | None = None
    stage: str | None = None
    stages_run: list[str] = field(default_factory=list)

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
                   usage_by_model=record.get("usage_by_model") or {}, confidence=record.get("confidence"),
                   raw_confidence=record.get("raw_confidence"),
                   confidence_calibrated=record.get("confidence_calibrated") is True, withheld=record.get("withheld"),
                   stage=record.get("stage"), stages_run=list(record.get("stages_run") or []))

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


class Judge(LoadedJudge):
    """A loaded evaluator bound to an LM. Use as a context manager, or call ``close()``."""

    def __init__(self, program: ChatEval, card: dict, lm: dspy.LM, stack: contextlib.ExitStack,
                 referee_lms: dict[str, dspy.LM] | None = None):
        self.program, self.card, self.lm = program, card, lm
        self.config = program.config
        self.referee_lms = dict(referee_lms or {})  # a mixed panel: role slug -> the LM its predictors are bound to
        self._stack = stack
        # Bound on the predictors (of a loaded program, never saved again), the panel stays mixed inside any
        # caller's DSPy context; the summarizer and the other referees keep the context's LM.
        for slug, referee_lm in self.referee_lms.items():
            referee = program.debate.referees[slug]
            referee.argue.lm = referee.judge.lm = referee_lm

    @property
    def format(self) -> str:
        return self.config.format

    @property
    def calibration(self) -> Calibration | None:
        """The evaluator's calibrated confidence and threshold (its calibration.json), None without one."""
        return getattr(self.program, "calibration", None)

    @property
    def task(self) -> TaskSpec:
        """The task this evaluator judges (its items' fields, criteria and scales)."""
        return self.config.task_spec

    def __call__(self, item: Mapping | object = _NOT_GIVEN, /, *, row: int | None = None, source: str | None = None,
                 **fields: str) -> Verdict:
        """Judge one item: a dict with the task's input fields (``id`` optional; other keys ignored), or those
        fields as keyword arguments, as a DSPy module takes them. ``row`` and ``source`` (default ``item``) name
        the item in error messages.

        Raises:
            TypeError: both ``item`` and fields, neither, a field the task does not have, or a required one missing.
            DataError: a field is not text, or is empty where the task needs text.
        """
        return self.verdict(self.record(self.example(item, row=row, source=source, **fields)))

    def record(self, example: dspy.Example) -> dict:
        """The results line of a checked item (``example``), judged on this judge's LMs."""
        with dspy.context(lm=self.lm, adapter=DebateAdapter()):
            return result_record(self.program, example, self.config)

    def verdict(self, record: dict) -> Verdict:
        """The verdict a results line of this judge's task records (``Verdict.from_record``)."""
        return Verdict.from_record(record, self.task)

    def example(self, item: Mapping | object = _NOT_GIVEN, /, *, row: int | None = None, source: str | None = None,
                **fields: str) -> dspy.Example:
        """The checked item a call judges (``__call__``'s arguments and errors), not yet judged."""
        if source is not None and item is _NOT_GIVEN and "source" in self.task.input_names:
            fields["source"], source = source, None  # a task input named ``source``: a field, not the error label
        return item_from_record(self._item(item, fields), self.task, source=source or "item", row=row)

    def _item(self, item, fields: dict):
        """The item a call gives: its dict (checked by ``item_from_record``, as every record is), or its keyword
        fields checked against the task's inputs."""
        names = self.task.input_names
        listed = ", ".join(names)
        if item is not _NOT_GIVEN and fields:
            raise TypeError(f"give the item as a dict or as keyword fields ({listed}), not both; got the dict and "
                            f"{', '.join(map(repr, fields))}")
        if item is not _NOT_GIVEN:
            return item
        if not fields:
            raise TypeError(f"give the item to judge: a dict, or the task's fields as keywords ({listed})")
        unknown = [k for k in fields if k not in names and k != "id"]
        if unknown:
            raise TypeError(f"field(s) {', '.join(map(repr, unknown))} are not inputs of task "
                            f"{self.task.name!r}; its fields: {listed} (and id, optionally)")
        missing = [i.name for i in self.task.inputs if i.name not in fields and i.default is None]
        if missing:
            raise TypeError(f"missing field(s) {', '.join(map(repr, missing))} of task {self.task.name!r}; "
                            f"its fields: {listed}")
        return fields

    def with_program(self, program: ChatEval, card: dict | None = None) -> Judge:
        """A judge of ``program`` (a tuned copy of this one's; ``card`` replaces the card) on this judge's LM, which
        stays this judge's to close."""
        if program.config != self.config:
            raise ConfigError("with_program: the program's panel differs from this judge's; load its own evaluator")
        return Judge(program, dict(card or self.card), self.lm, contextlib.ExitStack(), referee_lms=self.referee_lms)

    def save(self, directory: str | Path) -> Path:
        """Save this judge's program and card as an evaluator directory (``load`` reads it back)."""
        return save_program(self.program, directory, self.card)


def load(path_or_uri: str | Path, *, lm: LMSpec | None = None, slots: int = 4, trust_pickle: bool = False,
         journal: str | Path | None = None, on_wave: Callable[[dict], None] | None = None,
         stage_models: dict[str, str] | None = None) -> Judge | CascadeJudge:
    """Load a saved evaluator and bind it to its LMs (a mixed panel: each referee to its own), or a saved cascade
    (``saved.cascade``: a ``CascadeJudge``, each stage loaded as here and bound to its own LM).

    Args:
        path_or_uri: A saved evaluator or cascade: its directory, ``runs:/<run_id>[/path]`` (``/pyfunc`` too),
            ``models:/<name>/<version>``, ``models:/<name>/latest`` or ``models:/<name>@<alias>``.
        lm: The LM and its call settings, as every command takes them. ``model`` None: the card's model name (and
            each referee the card assigns to another model on that one); a ``model`` given runs the whole panel
            unless ``lm.referee_models`` says otherwise (``binding``'s rule).
        slots: Requests kept in flight at once (the embedded model is laid out for them).
        trust_pickle: Allow loading a pickled program (runs code from the file).
        journal: Batch mode (``lm.batch``): the folder that keeps the batches and their answers; judge items with
            ``score_file(..., waves=True)``. A mixed panel is not batched.
        on_wave: Batch mode: sees each wave's progress.
        stage_models: A cascade's ``{stage name: model}``: those stages run on that model with ``lm``'s settings;
            the others on ``lm.model`` if given, else on their card's model.

    Example:
        >>> from chateval_dspy.config import DebateConfig
        >>> from chateval_dspy.deploy.saved.card import make_card
        >>> from chateval_dspy.deploy.saved.store import save_program
        >>> from chateval_dspy.program.chateval import build_evaluator
        >>> program = build_evaluator(DebateConfig(roles=("critic", "scientist"), turns=1, calibrate=False))
        >>> _ = save_program(program, tmp / "mixed", make_card(
        ...     program, model="openai-compatible/fake-served", referee_models={"scientist": "openai/gpt-4o-mini"}))
        >>> spec = LMSpec(model=fake_url, referee_models={"scientist": fake_url}, cache=False)
        >>> with load(tmp / "mixed", lm=spec) as judge:
        ...     v = judge({"question": "2+2?", "answer_1": "4", "answer_2": "5"})
        >>> sorted(judge.referee_lms), list(v.usage_by_model), v.cost_usd is None
        (['scientist'], ['openai-compatible/fake-served'], True)
    """
    lm = lm or LMSpec()
    stack = contextlib.ExitStack()
    try:
        found = _fetched(str(path_or_uri), trust_pickle, stack)
        options = {"slots": slots, "journal": journal, "on_wave": on_wave}
        if isinstance(found, Path) and is_cascade(found):
            if lm.referee_models:
                raise ConfigError(f"{path_or_uri} is a cascade: bind its stages with stage_models (referee_models "
                                  "is for one evaluator)")
            return _load_cascade(found, stack, lm, stage_models=stage_models, **options)
        if stage_models:
            raise ConfigError(f"stage_models: {path_or_uri} is one evaluator, not a cascade")
        return _bound(*_saved(found), stack, lm, **options)
    except BaseException:
        stack.close()
        raise


def _bound(program: ChatEval, card: dict, stack: contextlib.ExitStack, lm: LMSpec, *, slots: int,
           journal: str | Path | None, on_wave: Callable[[dict], None] | None) -> Judge:
    """``program`` bound to the LMs of ``lm`` (defaulted from ``card``), which ``stack`` closes."""
    roles = tuple(program.config.roles)
    model = lm.model or default_model(card)  # the panel's model is named first, then each referee's
    referees = referee_specs(card, roles, model=lm.model, referee_models=lm.referee_map)
    spec = replace(lm, model=model, referee_models=referees)  # batch mode refuses a mix
    main, referee_lms = stack.enter_context(spec.opened(slots, journal=journal, on_wave=on_wave))
    warn_if_moved(card, main, referee_lms, roles)
    return Judge(program, card, main, stack, referee_lms)


def _load_cascade(directory: Path, stack: contextlib.ExitStack, lm: LMSpec, *,
                  stage_models: dict[str, str] | None, journal: str | Path | None, **options) -> CascadeJudge:
    """The cascade saved in ``directory``, each stage ``load``-ed as ``load``'s ``stage_models`` says; in batch mode
    each stage keeps its batches in a journal of its own (``<journal>/<i>-<name>``)."""
    spec = read_cascade(directory)
    unknown = sorted(set(stage_models or {}) - {s.name for s in spec.stages})
    if unknown:
        raise ConfigError(f"stage_models names stage(s) {unknown} that {directory} does not have; its stages: "
                          f"{', '.join(s.name for s in spec.stages)}")
    judges = []
    for i, stage in enumerate(spec.stages, start=1):
        staged = None if journal is None else Path(journal) / f"{i}-{stage.name}"
        stage_lm = replace(lm, model=(stage_models or {}).get(stage.name) or lm.model)
        judges.append(stack.enter_context(load(stage.dir, lm=stage_lm, journal=staged, **options)))
    return CascadeJudge(spec, judges, stack)


def _fetched(source: str, trust_pickle: bool, stack: contextlib.ExitStack) -> Path | ChatEval:
    """The saved evaluator (or cascade) directory at ``source`` (an MLflow URI fetched into a temporary directory that
    ``stack`` removes), or an unpickled program (if trusted)."""
    if source.startswith(MLFLOW_SCHEMES):
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chateval-load-")))
        return from_mlflow(source, workdir, trust_pickle)
    found = Path(source)
    return unpickle_file(found, trust_pickle) if is_pickled(found, CARD_FILE) else found


def _saved(found: Path | ChatEval) -> tuple[ChatEval, dict]:
    """The program and card of a fetched evaluator (``_fetched``)."""
    if isinstance(found, ChatEval):
        return trusted(found), {"model": None, "config": found.config.to_dict()}
    _check_version(read_card(found), str(found / CARD_FILE))
    return load_program(found)
