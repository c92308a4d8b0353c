"""A cascade of saved evaluators at run time: cheap stages first, an item leaving at the first stage confident enough
(how an item leaves, and what its verdict says: docs/selective.md, "Cascades").

Layout of a saved cascade directory (``save_cascade`` writes it, ``read_cascade`` checks it, ``load`` runs it)::

    cascade.json           format, version, level, risk, the stages' names and thresholds, and a free-form report
    stages/1-<name>/       a complete saved evaluator with its calibration.json (its map; its threshold is ignored)
    stages/2-<name>/       ...

Nothing in the directory is trusted: cascade.json is read within its limit and checked field by field; each stage's
directory is derived from its checked name and must be a real directory inside the cascade's, with no linked file,
holding its calibration, every stage of one task; each stage then loads as any saved evaluator does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import chateval_dspy.limits as limits
from chateval_dspy.deploy.saved.certificate import finite_number
from chateval_dspy.deploy.saved.store import (
    CALIBRATION_FILE,
    CARD_FILE,
    PROGRAM_FILE,
    load_program,
    read_card,
    read_json_file,
    save_program,
)
from chateval_dspy.deploy.saved.untrusted import check_card
from chateval_dspy.deploy.saved.verdicts import LoadedJudge
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.files import write_atomic
from chateval_dspy.lm.pricing import add_usd
from chateval_dspy.program.confidence import NEEDS_PERSON, lowest
from chateval_dspy.run.identity import digest

CASCADE_FILE, CASCADE_FORMAT, CASCADE_VERSION, STAGES_DIR = "cascade.json", "chateval-cascade", 1, "stages"
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
FIELDS = ("format", "version", "level", "risk", "stages", "report")
STAGE_FIELDS = ("name", "threshold")
# A stage's summed figures: counts and seconds add up; dollars add up unless a stage is unpriced (then None).
SUMMED = ("calls", "cached_calls", "failed_calls", "prompt_tokens", "cached_prompt_tokens", "cache_write_tokens",
          "completion_tokens", "seconds")


@dataclass(frozen=True)
class StageSpec:
    """One stage: its ``name``, its saved evaluator's directory ``dir`` and its ``threshold`` (None: no verdict)."""

    name: str
    dir: Path
    threshold: float | None

    def keeps(self, record: Mapping) -> bool:
        """Whether this stage gives its verdict on a results line: it has one, and a calibrated confidence at least
        the threshold."""
        confidence = lowest(record.get("confidence"))
        return self.threshold is not None and record.get("prediction") is not None and confidence is not None \
            and confidence >= self.threshold


@dataclass(frozen=True)
class CascadeSpec:
    """A checked ``cascade.json``: the guaranteed ``level`` at ``risk``, the ``stages`` cheapest first, and the
    ``report`` the optim side wrote (only ever displayed)."""

    level: float
    risk: float
    stages: tuple[StageSpec, ...]
    report: dict = dataclasses.field(default_factory=dict)

    def card_block(self) -> dict:
        """What a cascade's card says of it (``CascadeJudge.card["cascade"]``)."""
        return {"level": self.level, "risk": self.risk,
                "stages": [{"name": s.name, "threshold": s.threshold} for s in self.stages]}


def stage_dir(directory: str | Path, index: int, name: str) -> Path:
    """Where stage ``index`` (from 1) named ``name`` lives in a cascade directory."""
    return Path(directory) / STAGES_DIR / f"{index}-{name}"


def is_cascade(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a ``cascade.json`` (not yet checked)."""
    path = Path(path)
    return path.is_dir() and ((path / CASCADE_FILE).exists() or (path / CASCADE_FILE).is_symlink())


def check_spec(data, source: str) -> None:
    """A ``ConfigError`` naming ``source`` and the field unless ``data`` is a valid cascade.json (its schema)."""
    def refuse(name: str, problem: str):
        raise ConfigError(f"{source}: cascade field '{name}': {problem}")

    if not isinstance(data, Mapping) or not set(FIELDS) - {"report"} <= set(data) <= set(FIELDS):
        got = sorted(map(str, data))[:10] if isinstance(data, Mapping) else shown(data, 60)
        raise ConfigError(f"{source}: a cascade is an object of {', '.join(FIELDS)} (report optional); got {got}")
    if data["format"] != CASCADE_FORMAT or data["version"] != CASCADE_VERSION or isinstance(data["version"], bool):
        refuse("format", f"this chateval-dspy reads {CASCADE_FORMAT!r} version {CASCADE_VERSION}, got "
                         f"{shown(data['format'], 40)} version {shown(data['version'], 20)}")
    for name in ("level", "risk"):
        if not finite_number(data[name]) or not 0 < data[name] < 1:
            refuse(name, f"must be a number strictly between 0 and 1, got {shown(data[name], 40)}")
    stages = data["stages"]
    if not isinstance(stages, list) or not 1 <= len(stages) <= limits.MAX_CASCADE_STAGES:
        refuse("stages", f"must be a list of 1 to {limits.MAX_CASCADE_STAGES} stages (limits.MAX_CASCADE_STAGES), "
                         f"got {shown(stages, 60)}")
    for i, stage in enumerate(stages, start=1):
        if not isinstance(stage, Mapping) or set(stage) != set(STAGE_FIELDS):
            refuse(f"stages[{i}]", f"a stage is an object of exactly name and threshold, got {shown(stage, 60)}")
        if not isinstance(stage["name"], str) or not NAME.fullmatch(stage["name"]):
            refuse(f"stages[{i}].name", f"must match {NAME.pattern}, got {shown(stage['name'], 50)}")
        t = stage["threshold"]
        if t is not None and (not finite_number(t) or not 0 <= t <= 1):
            refuse(f"stages[{i}].threshold", f"must be a number in [0, 1] or null, got {shown(t, 40)}")
    names = [s["name"] for s in stages]
    if len(set(names)) != len(names):
        refuse("stages", f"stage names must differ, got {names}")
    if not isinstance(data.get("report", {}), Mapping):
        refuse("report", f"must be an object, got {shown(data['report'], 60)}")


def _no_link(path: Path, directory: Path, what: str) -> None:
    if path.is_symlink():
        raise ConfigError(f"{directory}: {what} {path} is a symbolic link; a cascade's files are its own: copy them in")


def _check_stage_dir(directory: Path, stage: StageSpec) -> tuple:
    """The stage's directory checked (real, inside ``directory``, no linked file, calibrated); its card's config."""
    _no_link(directory / STAGES_DIR, directory, "folder")
    _no_link(stage.dir, directory, f"stage {stage.name!r}")
    if not stage.dir.is_dir():
        raise ConfigError(f"{directory}: stage {stage.name!r} has no saved evaluator at {stage.dir}")
    if not stage.dir.resolve().is_relative_to(directory.resolve()):
        raise ConfigError(f"{directory}: stage {stage.name!r} leads outside the cascade ({stage.dir.resolve()})")
    for name in (CARD_FILE, PROGRAM_FILE, CALIBRATION_FILE):
        _no_link(stage.dir / name, directory, "file")
    if not (stage.dir / CALIBRATION_FILE).is_file():
        raise ConfigError(f"{stage.dir}: a cascade's stage needs its {CALIBRATION_FILE} (its calibrated confidence "
                          "decides which items it keeps): calibrate it (chateval calibrate)")
    config, _ = check_card(read_card(stage.dir), stage.dir / CARD_FILE)
    return config


def read_cascade(directory: str | Path) -> CascadeSpec:
    """The checked cascade saved in ``directory`` (the module docstring's rules), its stages not yet loaded; a
    ``ConfigError`` naming the file and the field for any rule it breaks."""
    directory = Path(directory)
    path = directory / CASCADE_FILE
    _no_link(path, directory, "file")
    if not path.is_file():
        raise ConfigError(f"{directory} is not a saved cascade: no {CASCADE_FILE}")
    data = read_json_file(path, limits.MAX_CASCADE_FILE_BYTES, "limits.MAX_CASCADE_FILE_BYTES")
    check_spec(data, str(path))
    stages = tuple(StageSpec(s["name"], stage_dir(directory, i, s["name"]),
                             None if s["threshold"] is None else float(s["threshold"]))
                   for i, s in enumerate(data["stages"], start=1))
    tasks = [(_check_stage_dir(directory, s).task_spec, s.name) for s in stages]
    for task, name in tasks[1:]:
        if task != tasks[0][0]:
            raise ConfigError(f"{path}: stage {name!r} judges task {task.name!r} ({task.format}), stage "
                              f"{tasks[0][1]!r} task {tasks[0][0].name!r} ({tasks[0][0].format}): every stage of a "
                              "cascade judges the same task")
    return CascadeSpec(float(data["level"]), float(data["risk"]), stages, dict(data.get("report") or {}))


def save_cascade(directory: str | Path, stages: Sequence[tuple[str, str | Path]], thresholds: Sequence[float | None],
                 *, level: float, risk: float, report: dict | None = None) -> Path:
    """Save a cascade into ``directory`` (created; a saved cascade there is replaced, anything else refused): each
    stage's calibrated evaluator (``(name, directory)``, cheapest first) copied into ``stages/<i>-<name>/``, and
    ``cascade.json`` with each stage's threshold (None: no verdict), the ``level`` guaranteed at ``risk``, and a
    ``report`` to display. Returns the path of ``cascade.json``."""
    directory = Path(directory)
    if len(stages) != len(thresholds):
        raise ConfigError(f"save_cascade: {len(stages)} stage(s) but {len(thresholds)} threshold(s)")
    data = {"format": CASCADE_FORMAT, "version": CASCADE_VERSION, "level": level, "risk": risk,
            "stages": [{"name": name, "threshold": t} for (name, _), t in zip(stages, thresholds)],
            "report": dict(report or {})}
    check_spec(data, f"save_cascade({directory})")
    text = (json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    if len(text) > limits.MAX_CASCADE_FILE_BYTES:
        raise ConfigError(f"save_cascade: cascade.json would be {len(text)} bytes, over "
                          f"limits.MAX_CASCADE_FILE_BYTES ({limits.MAX_CASCADE_FILE_BYTES}): shorten the report")
    loaded = [(name, *load_program(src)) for name, src in stages]
    for (name, src), (_, program, _) in zip(stages, loaded):
        if program.calibration is None:
            raise ConfigError(f"save_cascade: stage {name!r} ({src}) has no {CALIBRATION_FILE}: calibrate it first")
        if program.config.task_spec != loaded[0][1].config.task_spec:
            raise ConfigError(f"save_cascade: stage {name!r} judges another task than stage {loaded[0][0]!r}")
    _clear(directory)
    for i, (name, program, card) in enumerate(loaded, start=1):
        save_program(program, stage_dir(directory, i, name), card)
    write_atomic(directory / CASCADE_FILE, text)
    return directory / CASCADE_FILE


def _clear(directory: Path) -> None:
    """Make ``directory`` ready for a cascade: created, or an earlier cascade's stages removed; anything else there
    is refused."""
    if directory.is_symlink():
        raise ConfigError(f"save_cascade: {directory} is a symbolic link; give the directory's own path")
    if directory.exists() and any(directory.iterdir()) and not is_cascade(directory):
        raise ConfigError(f"save_cascade: {directory} holds something other than a saved cascade; choose another "
                          "directory, or empty it")
    _no_link(directory / STAGES_DIR, directory, "folder")
    shutil.rmtree(directory / STAGES_DIR, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)


def cascade_record(records: Sequence[dict], stages: Sequence[StageSpec]) -> dict:
    """The results line of an item from the lines its stages wrote (``records``, one per stage that judged it, in
    order): the keeping stage's verdict, or the last one withheld (``needs_person``); ``stage``, ``stages_run``, and
    the figures summed over the stages.

    Example:
        >>> line = {"id": "a", "prediction": "1", "confidence": 0.7, "abstained": None, "calls": 2, "seconds": 1.0,
        ...         "prompt_tokens": 10, "completion_tokens": 2, "cost_usd": None, "usage_by_model": {}}
        >>> stages = [StageSpec("single", Path("s"), 0.9), StageSpec("panel", Path("p"), 0.6)]
        >>> got = cascade_record([line, {**line, "prediction": "2", "calls": 8}], stages)
        >>> got["prediction"], got["stage"], got["stages_run"], got["calls"]
        ('2', 'panel', ['single', 'panel'], 10)
        >>> got = cascade_record([line], stages[:1])
        >>> got["prediction"], got["withheld"], got["abstained"], got["stage"]
        (None, '1', 'needs_person', None)
    """
    last, stage = records[-1], stages[len(records) - 1]
    out = {**last, **summed(records)}
    if stage.keeps(last):
        out["stage"] = stage.name
    else:
        out.update(prediction=None, withheld=last.get("prediction"), abstained=NEEDS_PERSON, stage=None)
        out.pop("correct", None)
    out["stages_run"] = [s.name for s in stages[:len(records)]]
    return out


def summed(records: Sequence[dict]) -> dict:
    """The figures of several results lines of one item added up: ``SUMMED``, ``cost_usd`` (None when any stage is
    unpriced) and ``usage_by_model`` (each model's figures added up)."""
    out: dict = {}
    for name in SUMMED:
        values = [r[name] for r in records if r.get(name) is not None]
        if values:
            out[name] = round(sum(values), 3) if name == "seconds" else sum(values)
    out["cost_usd"] = 0.0
    models: dict[str, dict] = {}
    for r in records:
        out["cost_usd"] = add_usd(out["cost_usd"], r.get("cost_usd"))
        for model, figures in (r.get("usage_by_model") or {}).items():
            models[model] = _add_figures(models.get(model), figures)
    out["usage_by_model"] = models
    return out


def _add_figures(into: dict | None, figures: dict) -> dict:
    if into is None:
        return dict(figures)
    out = dict(into)
    for name, value in figures.items():
        if name == "cost_usd":
            out[name] = add_usd(out.get(name, 0.0), value)
        elif name in SUMMED and isinstance(value, (int, float)):
            out[name] = (out.get(name) or 0) + value
    return out


def without_threshold(program) -> None:
    """Drop ``program``'s own threshold (and its level and risk), keeping its map: inside a cascade the cascade's
    thresholds decide which verdicts are given."""
    calibration = program.calibration
    if calibration is not None and calibration.threshold is not None:
        program.calibration = dataclasses.replace(calibration, threshold=None, level=None, risk=None)


def cascade_digest(spec: CascadeSpec, stage_digests: Sequence[str]) -> str:
    """A digest of a cascade, not of its LMs: its level, risk and thresholds, and each stage's digest
    (``parts.evaluator_digest`` of its program as the cascade runs it: ``without_threshold``)."""
    return digest({"cascade": spec.card_block(), "stages": list(stage_digests)})


class CascadeJudge(LoadedJudge):
    """A loaded cascade: the surface of ``deploy.saved.judge.Judge`` over stages that each run on their own LM.

    ``stages`` are the stages' loaded ``Judge``s, cheapest first (each stage's calibration map kept, its threshold
    dropped: the cascade's rule); ``spec`` is the checked cascade.json. Build it with ``deploy.saved.judge.load``.
    """

    def __init__(self, spec: CascadeSpec, stages: list, stack: contextlib.ExitStack):
        self.spec, self.stages, self._stack = spec, stages, stack
        for judge in stages:
            without_threshold(judge.program)
        self.card = {**stages[-1].card, "cascade": spec.card_block()}

    @property
    def format(self) -> str:
        return self.stages[0].format

    @property
    def task(self):
        return self.stages[0].task

    @property
    def calibration(self) -> None:
        """None: a cascade's stages each have their map, and the cascade's thresholds decide."""
        return None

    def __call__(self, *item, row: int | None = None, source: str | None = None, **fields):
        """Judge one item as ``Judge.__call__`` takes it, stage after stage until one keeps it."""
        example = self.stages[0].example(*item, row=row, source=source, **fields)
        records = []
        for judge, stage in zip(self.stages, self.spec.stages):
            records.append(judge.record(example))
            if stage.keeps(records[-1]):
                break
        return self.verdict(records)

    def verdict(self, records: Sequence[dict]):
        """The ``deploy.saved.judge.Verdict`` of an item from its stages' results lines (``cascade_record``)."""
        return self.stages[0].verdict(cascade_record(records, self.spec.stages))

    def in_stages(self, todo: Iterable[tuple], runner, workers: int) -> Iterator[tuple]:
        """Batch mode: stage 1 on every ``(key, example)`` of ``todo``, then stage 2 on those stage 1 did not keep,
        and so on; ``runner(fn, items, workers)`` (``concurrency.run_gated``) makes each stage's calls in waves.
        Yields ``(key, verdict)`` as each item leaves the cascade."""
        todo, lines = list(todo), {}
        keys = [key for key, _ in todo]
        pending = [(n, example) for n, (_, example) in enumerate(todo)]  # by position: a key need not be hashable
        for judge, stage in zip(self.stages, self.spec.stages):
            going_on = []
            for (n, example), record in runner(lambda x, j=judge: j.record(x[1]), pending, workers):
                lines.setdefault(n, []).append(record)
                if stage.keeps(record) or stage is self.spec.stages[-1]:
                    yield keys[n], self.verdict(lines.pop(n))
                else:
                    going_on.append((n, example))
            pending = going_on

