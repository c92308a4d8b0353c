"""``chateval cascade`` as a library: build a cascade of saved evaluators, cheapest first, on labelled items.

Declared by ``read_declaration`` (YAML) or ``declare`` (the ``--stage`` flags); ``build_cascade`` has every stage
judge both halves of ``chateval calibrate``'s items, refits each stage's map on the same calibration half, chooses the
thresholds together (Bonferroni over the stages) and routes the check half as the saved cascade would. What it
guarantees and how to read the report: docs/selective.md. A level no stage reaches is reported with the best level
reachable and the cascade saved with no threshold: the level asked for is never lowered silently.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path

from chateval_dspy import limits
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.run.metrics import Estimate, bootstrap, plain
from optim.tuning import calibrate
from optim.tuning.calibrate import HALVES, calibration_items, fit, given_pairs, judge_halves
from optim.tuning.selective import Cascade, choose_cascade_thresholds, exact_rate, rate_text, route

# A declaration is a few lines; anything much longer is not one (read before parsing).
MAX_DECLARATION_BYTES = 64 * 1024
DECLARATION_KEYS = ("level", "risk", "stages")


@dataclass(frozen=True)
class DeclaredStage:
    """One stage as declared (``program``: its saved evaluator's directory; ``model`` None: its card's model)."""

    name: str
    program: Path
    model: str | None = None


@dataclass(frozen=True)
class DeclaredCascade:
    """A cascade as declared: the agreement ``level`` to guarantee at ``risk``, and its ``stages``, cheapest first."""

    level: float
    risk: float
    stages: tuple[DeclaredStage, ...]


def check_declaration(data, source: str, *, model_names_only: bool = True) -> DeclaredCascade:
    """The ``DeclaredCascade`` of ``data`` (a parsed YAML mapping, untrusted), or a ``ConfigError`` naming
    ``source`` and the key. A stage's ``program`` is a path as ``--stage`` takes it (relative to the folder the
    command runs in, not to the file, so that a file and the flags declare the same). With ``model_names_only`` a stage's
    ``model`` must be a model name (as a card's), never an endpoint URL, a key or settings: a file chooses no
    endpoint; a base URL is given on the command line (``--stage NAME=DIR@URL``).

    Example:
        >>> d = check_declaration({"level": 0.85, "risk": 0.1, "stages": [{"name": "single", "program": "p/s"}]}, "x")
        >>> d.stages[0].name, d.stages[0].model
        ('single', None)
        >>> check_declaration({"level": 1.2, "risk": 0.1, "stages": []}, "cascade.yaml")
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: cascade.yaml: key 'level': must be a number strictly between 0 and 1, got 1.2
    """
    if not isinstance(data, dict) or set(data) != set(DECLARATION_KEYS):
        got = sorted(map(str, data))[:10] if isinstance(data, dict) else shown(data, 60)
        raise ConfigError(f"{source}: a cascade declares exactly {', '.join(DECLARATION_KEYS)}; got {got}")
    for key in ("level", "risk"):  # NaN and infinities fail the range test too
        if isinstance(data[key], bool) or not isinstance(data[key], (int, float)) or not 0 < data[key] < 1:
            raise ConfigError(f"{source}: key {key!r}: must be a number strictly between 0 and 1, got "
                              f"{shown(data[key], 40)}")
    stages = data["stages"]
    if not isinstance(stages, list) or not 1 <= len(stages) <= limits.MAX_CASCADE_STAGES:
        raise ConfigError(f"{source}: key 'stages': a list of 1 to {limits.MAX_CASCADE_STAGES} stages, cheapest "
                          f"first (limits.MAX_CASCADE_STAGES); got {shown(stages, 60)}")
    out = [_check_stage(stage, f"stages[{i}]", source, model_names_only)
           for i, stage in enumerate(stages, start=1)]
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: key 'stages': stage names must differ, got {names}")
    return DeclaredCascade(float(data["level"]), float(data["risk"]), tuple(out))


def _check_stage(stage, key: str, source: str, model_names_only: bool) -> DeclaredStage:
    from chateval_dspy.deploy.saved.cascade import NAME
    from chateval_dspy.deploy.saved.untrusted import check_model_name

    if not isinstance(stage, dict) or not {"name", "program"} <= set(stage) <= {"name", "program", "model"}:
        raise ConfigError(f"{source}: key {key!r}: a stage is name, program and optionally model; got "
                          f"{shown(stage, 80)}")
    if not isinstance(stage["name"], str) or not NAME.match(stage["name"]):
        raise ConfigError(f"{source}: key '{key}.name': must match {NAME.pattern}, got {shown(stage['name'], 50)}")
    program = stage["program"]
    if not isinstance(program, str) or not program or len(program) > 1000 or "\0" in program:
        raise ConfigError(f"{source}: key '{key}.program': a saved evaluator's directory, got {shown(program, 60)}")
    model = stage.get("model")
    if model_names_only:
        check_model_name(model, source, key=f"{key}.model")
    if model is not None and (not isinstance(model, str) or not model or len(model) > 1000):
        raise ConfigError(f"{source}: key '{key}.model': a model spec, got {shown(model, 60)}; leave it out to run "
                          "the stage on its card's model")
    return DeclaredStage(stage["name"], Path(program), model)


def read_declaration(path: str | Path) -> DeclaredCascade:
    """The cascade declared in the YAML file ``path``: read within ``MAX_DECLARATION_BYTES``, parsed by
    ``limits.parse_yaml`` and checked by ``check_declaration``; a ``ConfigError`` naming the file otherwise."""
    path = Path(path)
    raw = limits.read_bounded(path, MAX_DECLARATION_BYTES, "optim.tuning.cascade.MAX_DECLARATION_BYTES",
                              "cascade declaration")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    # A bounded loader: no alias of a list or mapping, so no document can expand past the file's own size.
    return check_declaration(limits.parse_yaml(text, str(path)), str(path))


def parse_stage(text: str) -> dict:
    """A ``--stage`` flag, ``NAME=PROGRAM_DIR[@MODEL]``, as a declared stage's keys (the model is split at the first
    ``@``, so a model spec may hold one).

    Example:
        >>> parse_stage("single=programs/single@openai/gpt-4o-mini")
        {'name': 'single', 'program': 'programs/single', 'model': 'openai/gpt-4o-mini'}
        >>> parse_stage("panel=programs/panel")
        {'name': 'panel', 'program': 'programs/panel'}
    """
    name, eq, rest = text.partition("=")
    if not eq or not rest:
        raise ConfigError(f"--stage {text[:80]!r}: write NAME=PROGRAM_DIR or NAME=PROGRAM_DIR@MODEL")
    program, at, model = rest.partition("@")
    return {"name": name, "program": program, **({"model": model} if at else {})}


def declare(stages: list[str], *, level: float | None, risk: float | None) -> DeclaredCascade:
    """The cascade the command's flags declare: ``--stage`` values (cheapest first), ``--agree-at-least``, ``--risk``.
    A stage's model may be any spec ``--model`` takes (a base URL too): the flags are the user's own."""
    if level is None or risk is None or not stages:
        raise ConfigError("declare the cascade with --spec FILE, or with --stage NAME=PROGRAM_DIR[@MODEL] (cheapest "
                          "first, at least one) and --agree-at-least LEVEL --risk R")
    data = {"level": level, "risk": risk, "stages": [parse_stage(s) for s in stages]}
    return check_declaration(data, "--stage/--agree-at-least/--risk", model_names_only=False)


@dataclass
class StageRun:
    """One stage judged on both halves (``lines``: item id -> results line, failed items absent) on the LM named
    ``model``, and its map fitted on the calibration half (a ``Calibration`` without threshold: the cascade
    sets it); ``resumed``: items read back from the ``results`` file instead of judged."""

    stage: DeclaredStage
    model: str
    results: Path
    lines: dict[str, dict]
    calibration: object
    resumed: int = 0


def split_of(declared: DeclaredCascade, data: DataSpec, seed: int | None) -> tuple[DataSpec, object]:
    """``data``'s test split for every stage, and their task: under ``seed``, else the split seed the stages' cards
    record (they must agree: calibration items must be ones no stage was tuned on), else ``data.seed``.
    Checked before any model runs: every stage judges the same task."""
    from chateval_dspy.deploy.saved.store import load_program

    seeds, tasks = {}, {}
    for stage in declared.stages:
        program, card = load_program(stage.program)
        if (recorded := calibrate.recorded_seed(card)) is not None:
            seeds[stage.name] = recorded
        tasks[stage.name] = program.config.task_spec
    first = declared.stages[0].name
    for name, task in tasks.items():
        if task != tasks[first]:
            raise ConfigError(f"stage {name!r} judges task {task.name!r} ({task.format}), stage "
                              f"{first!r} task {tasks[first].name!r}: every stage of a cascade judges the same task")
    if seed is None and len(set(seeds.values())) > 1:
        raise ConfigError(f"the stages' cards record different split seeds ({seeds}): an item one stage was tested on "
                          "may have tuned another; give --seed to choose the split")
    seed = next(iter(seeds.values()), data.seed) if seed is None else seed
    return calibrate.split_for(data, seed, tasks[first]), tasks[first]


def judge_stage(stage: DeclaredStage, index: int, parts: dict[str, list], data: DataSpec, out_dir: Path, *,
                method: str, lm: LMSpec, concurrency: int = 1, on_item=None) -> StageRun:
    """Stage ``index`` (from 1) on both halves, into ``out_dir/<index>-<name>/``, on ``lm`` (the stage's declared
    model, else ``lm.model``, else its card's), and its map fitted on the calibration half (any calibration it was
    saved with is set aside while it judges: ``judge_halves``)."""
    from chateval_dspy.deploy.saved.judge import load

    with load(stage.program, lm=replace(lm, model=stage.model or lm.model), slots=concurrency) as judge:
        path, lines, resumed = judge_halves(judge, parts, out_dir / f"{index}-{stage.name}", concurrency=concurrency,
                                            on_item=on_item)
        model, task = judge.lm.model, judge.config.task_spec
    calibration, _ = fit(lines["calibration"], task, calibrate.fitted_on(data, model), method=method, level=None, risk=None)
    by_id = {str(line["id"]): line for half in HALVES for line in lines[half]}
    return StageRun(stage, model, path, by_id, calibration, resumed)


def save_fitted(run: StageRun, index: int, into: Path) -> Path:
    """A copy of the stage's saved evaluator carrying its fitted map, in ``into/<index>-<name>``; declared with a
    model, its card names that model (the one it was calibrated on, which ``load`` then binds)."""
    from chateval_dspy.deploy.saved.store import load_program, save_program

    program, card = load_program(run.stage.program)
    program.calibration = run.calibration
    if run.stage.model is not None:
        card = {**{k: v for k, v in card.items() if k != "referee_models"}, "model": run.model}
    return save_program(program, into / f"{index}-{run.stage.name}", card)


@dataclass
class Routed:
    """One half's items as the stages saw them, ``[stage][item]``: the calibrated confidence a threshold is held
    against (None: no verdict), whether people agreed with each labelled verdict (``given_pairs``), and the line."""

    ids: list[str]
    confidence: list[list[float | None]]
    hits: list[list[list[bool]]]
    lines: list[list[dict | None]]

    @cached_property
    def verdicts(self) -> list[int]:
        """Per item, its labelled verdicts (pointwise: one per labelled criterion), the most any stage compared."""
        return [max(len(stage[i]) for stage in self.hits) for i in range(len(self.ids))]

    def agreed(self, s: int, items) -> list[bool]:
        """Stage ``s``'s agreement per labelled verdict of ``items`` (indices); a verdict it lacks (none on the item,
        or a criterion left out) counts as disagreeing: the runtime never keeps it, so this can only make the test
        stricter."""
        return [h for i in items for h in self.hits[s][i] + [False] * (self.verdicts[i] - len(self.hits[s][i]))]

    def pairs(self) -> list[tuple[list[float], list[bool]]]:
        """Per stage, ``(confidence, agreed)`` per labelled verdict, over the same verdicts in the same order, for
        ``choose_cascade_thresholds``; an item without a verdict at confidence 0."""
        every = range(len(self.ids))
        return [([0.0 if conf[i] is None else conf[i] for i in every for _ in range(self.verdicts[i])],
                 self.agreed(s, every)) for s, conf in enumerate(self.confidence)]


def routed(runs: list[StageRun], items: list, task) -> Routed:
    """The half of ``items`` through every stage's results lines and map."""
    ids = [str(x.id) for x in items]
    lines = [[run.lines.get(i) for i in ids] for run in runs]
    pairs = [[given_pairs([line], task, run.calibration.map) if line is not None else ([], []) for line in stage]
             for run, stage in zip(runs, lines)]
    return Routed(ids, [[c[0] if c else None for c, _ in stage] for stage in pairs],
                  [[list(a) for _, a in stage] for stage in pairs], lines)


@dataclass(frozen=True)
class StageFigures:
    """One stage on the check half: the items that ``left`` the cascade here and their ``agreement`` with people
    (exact 95% CI over their labelled verdicts); the items it ``reached`` (no earlier stage kept them), with its
    ``calls`` and ``usd`` on them (None: a call was unpriced); and the same on every check item, with no threshold
    (``alone``, ``alone_calls``, ``alone_usd``). ``threshold`` None: it gives no verdict."""

    name: str
    model: str
    threshold: float | None
    left: int
    agreement: Estimate
    reached: int
    calls: int
    usd: float | None
    alone: Estimate
    alone_calls: int
    alone_usd: float | None


def _sum_usd(lines: list[dict | None]) -> float | None:
    values = [line.get("cost_usd") for line in lines if line is not None]
    return None if None in values else float(sum(values))


def _calls(lines: list[dict | None]) -> int:
    return sum(int(line.get("calls") or 0) for line in lines if line is not None)


def _share(hits: list[bool]) -> Estimate:
    return exact_rate(sum(hits), len(hits))


def check_figures(runs: list[StageRun], cascade: Cascade, check: Routed, *, seed: int) -> dict:
    """The check half routed as the saved cascade routes it (``selective.route``): each stage's figures, coverage,
    agreement, and USD per 1,000 verdicts (``CascadeReport``'s fields)."""
    leaves = route(check.confidence, cascade)
    stages = []
    for s, run in enumerate(runs):
        here = [i for i, leave in enumerate(leaves) if leave == s]
        reached = [check.lines[s][i] for i, leave in enumerate(leaves) if leave is None or leave >= s]
        stages.append(StageFigures(
            run.stage.name, run.model, cascade.stages[s].threshold, len(here), _share(check.agreed(s, here)),
            len(reached), _calls(reached), _sum_usd(reached), _share(check.agreed(s, range(len(leaves)))),
            _calls(check.lines[s]), _sum_usd(check.lines[s])))
    hits = [h for i, s in enumerate(leaves) if s is not None for h in check.agreed(s, [i])]
    return {"stages": stages, "coverage": _share([s is not None for s in leaves]), "agreement": _share(hits),
            "per_1000": per_thousand(check, leaves, seed=seed)}


def per_thousand(check: Routed, leaves: list[int | None], *, seed: int = 0) -> dict[str, Estimate | None]:
    """US dollars per 1,000 verdicts on the check half, with 95% bootstrap CIs over its items: the cascade's (its
    stages' dollars on the items they judged, over the verdicts it gave), and each of the first and the last stage
    on every item (a verdict on each). None where a call was unpriced."""
    spent = [[0.0 if line is None else line.get("cost_usd") for line in stage] for stage in check.lines]
    cascade = [[column[i] for s, column in enumerate(spent) if leave is None or leave >= s]
               for i, leave in enumerate(leaves)]
    given = [leave is not None for leave in leaves]
    out: dict[str, Estimate | None] = {"cascade": None}
    if None not in [v for row in cascade for v in row] and any(given):
        out["cascade"] = bootstrap(lambda u, g: 1000 * sum(u) / sum(g) if sum(g) else math.nan,
                                   [sum(row) for row in cascade], given, seed=seed)
    for key, column in (("first_stage", spent[0]), ("last_stage", spent[-1])):
        out[key] = None if None in column else bootstrap(lambda u: 1000 * sum(u) / len(u), column, seed=seed)
    return out


@dataclass
class CascadeReport:
    """What ``build_cascade`` chose on the calibration half (``cascade``), saved (``cascade.json``, and the figures
    in ``report.json``) and measured on the check half: per stage, and in all the coverage and agreement of the
    verdicts given (exact 95% CIs) and USD per 1,000 verdicts (``per_thousand``). ``n``: labelled verdicts per half;
    ``resumed``: items read back from the stages' ``results`` files instead of judged."""

    declared: DeclaredCascade
    cascade: Cascade
    header: dict
    n: dict[str, int]
    stages: list[StageFigures]
    coverage: Estimate
    agreement: Estimate
    per_1000: dict = field(default_factory=dict)
    saved: Path | None = None
    report_file: Path | None = None
    results: list[Path] = field(default_factory=list)
    resumed: int = 0

    @property
    def reached(self) -> bool:
        return self.cascade.reached

    @property
    def given(self) -> int:
        return sum(s.left for s in self.stages)

    def metrics(self) -> dict:
        """The check half's figures, for MLflow."""
        out: dict = {"coverage_check": self.coverage, "agreement_check": self.agreement}
        out.update({f"usd_per_1000_{k}_check": v for k, v in self.per_1000.items() if v is not None})
        for s in self.stages:
            out.update({f"{s.name}_left_check": s.left, f"{s.name}_agreement_check": s.agreement,
                        f"{s.name}_calls_check": s.calls, f"{s.name}_alone_agreement_check": s.alone})
            if s.usd is not None:
                out[f"{s.name}_usd_check"] = s.usd
        return out

    def to_dict(self) -> dict:
        """The figures as JSON (``cascade.json``'s ``report``, and the MLflow artifact)."""
        return _finite({"header": self.header, "n": self.n,
                "selection": [s.to_dict() for s in self.cascade.stages],
                "check": {"coverage": self.coverage.to_dict(), "agreement": self.agreement.to_dict(),
                          "usd_per_1000": plain(self.per_1000),
                          "stages": [plain(vars(s)) for s in self.stages]},
                "reached": self.reached, "best_level": self.cascade.best_level})

    def lines(self) -> list[str]:
        """What the command prints: every figure with its model, data, split, n and 95% interval."""
        h = self.header
        where = f"{h['data']} {h['split']}"
        stages = ", ".join(f"{i} {s.name} ({s.model})" for i, s in enumerate(self.stages, start=1))
        out = [f"cascade: {where} | calibration half {h['items']['calibration']} items ({self.n['calibration']} "
               f"verdicts), check half {h['items']['check']} items ({self.n['check']} verdicts) | stages: {stages}",
               self._selection_line()]
        check = f"check half ({where} | n={h['items']['check']} items)"
        for i, s in enumerate(self.stages, start=1):
            out.append(f"{check}: stage {i} {s.name} ({s.model}, threshold {_threshold(s.threshold)}): "
                       f"{s.left} item(s) left here, their agreement with people {_rate(s.agreement)} (exact 95% CI); "
                       f"judged {s.reached} item(s): {s.calls} calls, {'unpriced' if s.usd is None else f'${s.usd:.6f}'}")
        out.append(f"{check}: {h['items']['check'] - self.given} item(s) to a person (no stage kept them)")
        out.append(f"{check}: coverage {_rate(self.coverage)}, agreement with people of the verdicts given "
                   f"{_rate(self.agreement)} (exact 95% CI)")
        usd = [f"cascade {_est_usd(self.per_1000.get('cascade'))} ({self.given} verdicts given)"]
        usd += [f"{s.name} on every item {_est_usd(self.per_1000.get(key))} (agreement {_rate(s.alone)})"
                for key, s in (("last_stage", self.stages[-1]), ("first_stage", self.stages[0]))]
        out.append(f"{check}: USD per 1,000 verdicts (95% bootstrap CI over items): " + "; ".join(usd))
        if self.saved is not None:
            out.append(f"cascade: {self.saved}")
        out += [f"results: {p}" for p in self.results]
        return out

    def _selection_line(self) -> str:
        c = self.cascade
        head = f"level {c.level:g} at risk {c.risk:g} (each stage tested at risk {c.risk / len(c.stages):.3g}, Bonferroni)"
        chosen = "; ".join(f"{s.name}: {_threshold(sel.threshold)} on {sel.n_calibration} calibration verdicts"
                           for s, sel in zip(self.declared.stages, c.stages))
        if self.reached:
            return f"{head}: reached. Thresholds {chosen}; calibration coverage {_rate(c.coverage)}."
        best = (f"the best level reachable at this risk with these items is {c.best_level:.1%}"
                if c.best_level is not None else "no level can be guaranteed at this risk with these items")
        return (f"{head}: NOT REACHED by any stage ({chosen}); {best}. No threshold saved: the cascade gives no "
                "verdict, every item goes to a person with the last stage's verdict kept as withheld. Ask for a lower "
                "level or a higher risk, or build on more labelled items.")


def _finite(value):
    """``value`` with every NaN made None: JSON has no NaN (an empty rate is NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _threshold(t: float | None) -> str:
    return "none (gives no verdict)" if t is None else f">= {t:.4g}"


_rate = partial(rate_text, empty="n/a (no verdict)")


def _est_usd(e: Estimate | None) -> str:
    if e is None:
        return "unpriced"
    if math.isnan(e.value):
        return "n/a"
    ci = "" if math.isnan(e.low) else f" [${e.low:.4f}, ${e.high:.4f}]"
    return f"${e.value:.4f}{ci} of {e.n} items"


def build_cascade(declared: DeclaredCascade, data: DataSpec, *, out: str | Path, out_dir: str | Path,
                  method: str = "isotonic", seed: int | None = None, lm: LMSpec | None = None,
                  concurrency: int = 1, on_item=None) -> CascadeReport:
    """Judge, fit, choose, save (into ``out``, replacing a cascade there) and check a cascade (module docstring).
    ``out_dir`` holds each stage's resumable results (``<i>-<name>/``), the stages with their fitted maps
    (``fitted/``) and ``report.json``; ``seed`` defaults to the one the stages' cards record, else ``data.seed``; a
    stage's declared model replaces ``lm.model``.
    """
    from chateval_dspy.deploy.saved.cascade import save_cascade

    data, task = split_of(declared, data, seed)
    out_dir = Path(out_dir)
    parts = calibration_items(data)
    runs = [judge_stage(stage, i, parts, data, out_dir, method=method, lm=lm or LMSpec(), concurrency=concurrency,
                        on_item=on_item) for i, stage in enumerate(declared.stages, start=1)]
    calibration = routed(runs, parts["calibration"], task)
    cascade = choose_cascade_thresholds(calibration.pairs(), level=declared.level, risk=declared.risk)
    check = routed(runs, parts["check"], task)
    header = {"data": data.dataset, "split": f"test (seed {data.seed})",
              "items": {half: len(parts[half]) for half in HALVES},
              "models": {r.stage.name: r.model for r in runs}}
    report = CascadeReport(declared, cascade, header, {"calibration": sum(calibration.verdicts),
                                                       "check": sum(check.verdicts)},
                           **check_figures(runs, cascade, check, seed=data.seed),
                           results=[r.results for r in runs], resumed=sum(r.resumed for r in runs))
    fitted = [save_fitted(r, i, out_dir / "fitted") for i, r in enumerate(runs, start=1)]
    report.saved = save_cascade(out, [(r.stage.name, d) for r, d in zip(runs, fitted)],
                                [s.threshold for s in cascade.stages], level=declared.level, risk=declared.risk,
                                report=report.to_dict())
    report.report_file = out_dir / "report.json"
    report.report_file.write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return report


def log_report(report: CascadeReport, data: DataSpec, *, method: str, uri: str | None = None) -> str:
    """An MLflow run holding the report: params (each stage's name, model and threshold; data, split, level, risk,
    method), the check half's figures with their intervals, and the cascade, report and results files. Its id."""
    params = {"dataset": data.dataset, "split": report.header["split"], "seed": data.seed, "limit": data.limit,
              "method": method, "level": report.cascade.level, "risk": report.cascade.risk,
              "n_calibration": report.n["calibration"], "n_check": report.n["check"], "reached": report.reached,
              "best_level": report.cascade.best_level}
    for i, s in enumerate(report.stages, start=1):
        params.update({f"stage_{i}_name": s.name, f"stage_{i}_model": s.model, f"stage_{i}_threshold": s.threshold})
    files = (report.saved, report.report_file, *report.results)
    return calibrate.log_command("cascade", "cascade", params, report.metrics(), files, uri)


# A cascade's cost as a search objective (``chateval search --objectives agreement,cascade_cost``).
FIRST_STAGE = "first"  # the stage names a searched cascade's figures carry
TRIAL_STAGE = "panel"
IN_SAMPLE_NOTE = ("in-sample: the stages' confidence maps and the thresholds are fitted on the same dev items the "
                  "cost is measured on (no separate calibration split inside a trial), so the figure ranks panels and "
                  "is optimistic; build the cascade to use with `chateval cascade` on held-out items")


def fitted_stage(stage: DeclaredStage, lines: list[dict], task, *, model: str, results: Path | None,
                 fitted_on: dict) -> StageRun:
    """``lines`` (one results line per item judged) as a cascade stage, its map fitted on those very lines; without
    lines (every item failed) there is no map, and the stage keeps no item."""
    calibration = fit(lines, task, fitted_on, method="isotonic", level=None, risk=None)[0] if lines else None
    return StageRun(stage, model, results, {str(line["id"]): line for line in lines}, calibration)


def judge_first_stage(stage: DeclaredStage, items: list, out_dir: Path, *, fitted_on: dict, lm: LMSpec,
                      concurrency: int = 1) -> StageRun:
    """A searched cascade's first stage, judged once on ``items`` (a search's dev split) into a resumable results
    file under ``out_dir`` (a rerun or another worker reads it back), its map fitted on the same items. Its calls
    must carry US dollars (the cost map's, or ``lm.price_per_mtok``): a ``ConfigError`` otherwise, before any trial.
    It runs on ``lm`` with the stage's declared model (None: its card's)."""
    from chateval_dspy.deploy.saved.judge import load

    # The cache off, as for the trials: a cached answer reports no usage and would make the stage look free.
    with load(stage.program, lm=replace(lm, model=stage.model, cache=False), slots=concurrency) as judge:
        path, lines, _ = judge_halves(judge, {"calibration": list(items), "check": []}, Path(out_dir),
                                      concurrency=concurrency)
        model, task = judge.lm.model, judge.config.task_spec
    judged = lines["calibration"]
    if not judged:
        raise ConfigError(f"first stage {stage.program}: no dev item was judged (see {path})")
    if any(line.get("cost_usd") is None for line in judged):
        raise ConfigError(f"first stage {stage.program}: its calls on {model} carry no US dollars (see {path}), so no "
                          "cascade cost can be measured; run it on a model LiteLLM prices (--first-stage DIR@MODEL)")
    return fitted_stage(stage, judged, task, model=model, results=path, fitted_on={**fitted_on, "model": model})


@dataclass
class CascadeCost:
    """A cascade [first stage -> a trial's panel] on the search's dev items, thresholds chosen on those items
    (``IN_SAMPLE_NOTE``), with ``check_figures`` there. ``usd_per_1000`` is ``math.inf`` when no stage reaches the
    level: the cascade then gives no verdict, so a verdict at the guaranteed level costs without bound."""

    usd_per_1000: float
    cascade: Cascade
    figures: dict
    header: dict

    def to_dict(self) -> dict:
        """The figures as a trial's user attribute (JSON: an unreached cascade's dollars are None)."""
        f, reached = self.figures, self.cascade.reached
        return _finite({"header": self.header, "reached": reached, "in_sample": True,
                        "usd_per_1000": self.usd_per_1000 if reached else None,
                        "best_level": self.cascade.best_level,
                        "thresholds": [s.threshold for s in self.cascade.stages],
                        "coverage": f["coverage"].to_dict(), "agreement": f["agreement"].to_dict(),
                        "per_1000": plain(f["per_1000"]),
                        "stages": [plain(vars(s)) for s in f["stages"]]})

    def metrics(self) -> dict:
        """For the trial's MLflow run (``optim.tracking.runs.metric_values``); no dollars when unreached."""
        f = self.figures
        out = {"reached": float(self.cascade.reached), "coverage": f["coverage"], "agreement": f["agreement"]}
        out.update({f"usd_per_1000_{k}": v for k, v in f["per_1000"].items() if v is not None})
        return out


@dataclass(frozen=True)
class SearchedCascade:
    """What a ``cascade_cost`` search holds fixed: the first stage (judged once on the dev items), level and risk."""

    first: StageRun
    level: float
    risk: float
    header: dict = field(default_factory=dict)

    def cost_of(self, lines: list[dict], items: list, task, *, model: str, results: Path | None,
                seed: int = 0) -> CascadeCost:
        """The cascade [first stage -> the panel that wrote ``lines`` on ``items``] there, in-sample: thresholds
        chosen on both stages' maps fitted on these items, routed as the saved cascade would route them. A
        ``ConfigError`` when a call was unpriced."""
        panel = fitted_stage(DeclaredStage(TRIAL_STAGE, Path(".")), lines, task, model=model, results=results,
                             fitted_on={**self.header, "model": model})
        runs = [self.first, panel]
        dev = routed(runs, items, task)
        cascade = choose_cascade_thresholds(dev.pairs(), level=self.level, risk=self.risk)
        figures = check_figures(runs, cascade, dev, seed=seed)
        header = {**self.header, "n": len(items), "verdicts": sum(dev.verdicts)}
        if not cascade.reached:
            return CascadeCost(math.inf, cascade, figures, header)
        usd = figures["per_1000"]["cascade"]
        if usd is None:
            raise ConfigError(f"stage {panel.stage.name!r} ({panel.model}): a call carries no US dollars, so the "
                              "cascade's cost cannot be measured; search on a model LiteLLM prices, or state its "
                              "price with --price")
        return CascadeCost(float(usd.value), cascade, figures, header)
