"""``chateval calibrate`` as a library: fit a saved evaluator's confidence map, choose its threshold, check both.

The items are the seeded split's ``test`` part (the seed on the evaluator's card unless another is given), drawn into
a ``calibration`` and a ``check`` half (``halves``) and judged into one resumable results file. The map and the
threshold are fitted on the calibration half only and saved beside the evaluator; the check half, which neither saw,
reports calibration error, coverage and agreement with 95% intervals (docs/selective.md). A level that no threshold
reaches is reported with the best level reachable, and only the map is saved: the level is never lowered silently.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.confidence import Calibration, line_confidence
from chateval_dspy.run.metrics import Estimate
from optim.tuning.confidence import calibration_error, calibration_pairs, fit_confidence_map, panel_verdict, reliability_diagram
from optim.tuning.selective import MIN_ITEMS, Selection, choose_threshold, exact_rate, rate_text

HALVES = ("calibration", "check")


def halves(items: list, seed: int) -> dict[str, list]:
    """The items in two seeded halves, ``calibration`` (the larger when odd) and ``check``, each in input order.
    Which half an item lands in depends on the seed and the items' ids only, never on their order in the file.

    Example:
        >>> parts = halves([type("X", (), {"id": str(i)})() for i in range(5)], seed=0)
        >>> len(parts["calibration"]), len(parts["check"])
        (3, 2)
    """
    ids = sorted(str(x.id) for x in items)
    random.Random(f"calibration-halves-{seed}").shuffle(ids)
    first = set(ids[: (len(ids) + 1) // 2])
    return {"calibration": [x for x in items if str(x.id) in first],
            "check": [x for x in items if str(x.id) not in first]}


def calibration_items(data: DataSpec) -> dict[str, list]:
    """The ``test`` part of ``data``'s seeded split (its first ``limit`` items), in its two halves."""
    items, _ = data.load()
    test = data.parts(items)["test"]
    if len(test) < 2:
        raise ConfigError(f"{data.dataset}: the test split (seed {data.seed}) holds {len(test)} item(s); "
                          "calibration needs labelled items in both halves")
    return halves(test, data.seed)


@dataclass
class CalibrationReport:
    """What ``calibrate_judge`` fitted, saved (``calibration`` in the file ``saved``) and measured: ``n`` labelled
    verdicts per half (pointwise: one per labelled criterion); ``selection`` on the calibration half (None: no level
    asked for); on the check half, the calibration error before and after the map, the share of verdicts given and
    their agreement with people, and reliability ``diagrams``; ``resumed``: items read back instead of judged."""

    calibration: object
    saved: Path
    results: Path
    header: dict
    n: dict[str, int]
    selection: Selection | None = None
    ece_raw: Estimate | None = None
    ece_calibrated: Estimate | None = None
    coverage: Estimate | None = None
    agreement: Estimate | None = None
    diagrams: list[Path] = field(default_factory=list)
    resumed: int = 0

    @property
    def reached(self) -> bool:
        """No level asked for, or the level asked for was reached."""
        return self.selection is None or self.selection.reached

    def metrics(self) -> dict[str, Estimate]:
        out = {"ece_raw_check": self.ece_raw, "ece_calibrated_check": self.ece_calibrated,
               "coverage_check": self.coverage, "agreement_check": self.agreement}
        return {k: v for k, v in out.items() if v is not None}

    def lines(self) -> list[str]:
        """What the command prints: every figure with model, data, split, n and its 95% interval."""
        h = self.header
        where = f"{h['model']} | {h['data']} {h['split']}"
        out = [f"calibration: {where} | calibration half {self.n['calibration']} verdicts, check half "
               f"{self.n['check']} verdicts"]
        out.append(f"confidence map: {self.calibration.map.method}, fitted on the calibration half "
                   f"({self.calibration.map.n} verdicts)")
        if self.selection is not None:
            out.append(self._selection_line())
        out.append(f"check half ({where} | n={self.n['check']}): ECE before calibration {self.ece_raw}, after "
                   f"{self.ece_calibrated} (95% bootstrap CI)")
        if self.coverage is not None:
            out.append(f"check half ({where}): coverage {_rate(self.coverage)}, agreement with people of the "
                       f"verdicts given {_rate(self.agreement)} (exact 95% CI)")
        out += [f"reliability diagram: {p}" for p in self.diagrams]
        out += [f"calibration: {self.saved}", f"results: {self.results}"]
        return out

    def _selection_line(self) -> str:
        s = self.selection
        head = f"level {s.level:g} at risk {s.risk:g}"
        if s.reached:
            return f"{head}: reached. {s.describe()}"
        best = (f"the best level reachable at this risk with these items is {s.best_level:.1%}"
                if s.best_level is not None else "no level can be guaranteed at this risk with these items")
        few = (f" (the test needs at least {MIN_ITEMS} calibration verdicts at or above a threshold)"
               if s.n_calibration < MIN_ITEMS else "")
        return (f"{head}: NOT REACHED on {s.n_calibration} calibration verdicts{few}; {best}. No threshold saved: "
                "the evaluator gives every verdict, with its calibrated confidence and no guarantee. Ask for a lower "
                "level or a higher risk, or calibrate on more labelled items.")


_rate = partial(rate_text, empty="n/a (no verdict given)")


@contextlib.contextmanager
def uncalibrated(program) -> Iterator[None]:
    """``program`` without its calibration while the block runs: a calibration already saved would withhold
    verdicts (their ``prediction`` None), which a new fit needs, and would change the run key, so that a rerun
    after ``save_calibration`` could not resume the results file."""
    held = getattr(program, "calibration", None)
    program.calibration = None
    try:
        yield
    finally:
        program.calibration = held


def judge_halves(judge, parts: dict[str, list], out_dir: Path, *, concurrency: int = 1,
                 on_item=None) -> tuple[Path, dict[str, list[dict]], int]:
    """Judge both halves into one resumable results file: the file, each half's lines, and the items resumed."""
    import dspy

    from chateval_dspy.lm.adapter import DebateAdapter
    from chateval_dspy.run.evaluate import evaluate
    from chateval_dspy.run.identity import context_identity, run_key
    from chateval_dspy.run.records import is_error, read_records

    items = [x for half in HALVES for x in parts[half]]
    out_dir.mkdir(parents=True, exist_ok=True)
    with dspy.context(lm=judge.lm, adapter=DebateAdapter()), uncalibrated(judge.program):
        # Named by what is judged (panel, model, items, tuned state), as ``chateval evaluate`` names its file: a
        # rerun resumes it, another evaluator, model or --limit gets its own.
        path = out_dir / f"calibration-{run_key(judge.config, context_identity(), items, judge.program.dump_state())}.jsonl"
        result = evaluate(judge.program, items, judge.config, out=path, concurrency=concurrency, on_item=on_item)
    lines = {str(r["id"]): r for r in read_records(path) if not is_error(r)}
    return path, {half: [lines[str(x.id)] for x in parts[half] if str(x.id) in lines] for half in HALVES}, \
        result.resumed


def given_pairs(lines: list[dict], task, cmap) -> tuple[list[float], list[bool]]:
    """Per labelled verdict, the calibrated confidence a threshold is held against, and whether people agreed: the
    verdict's own, or pointwise its item's least confident criterion's for each labelled criterion (a verdict is
    given whole or not at all, so the threshold is chosen on what is given; criteria of one item then count as
    separate verdicts, though they are not independent). A withheld verdict counts as the panel's (``panel_verdict``).

    Example:
        >>> from chateval_dspy.program.confidence import ConfidenceMap
        >>> line = {"prediction": "1", "human": "1", "referees": {"a": [{"score_1": 9, "score_2": 2}]}}
        >>> confidence, agreed = given_pairs([line], "pairwise", ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.0, 0.5)))
        >>> [round(c, 3) for c in confidence], agreed
        ([0.463], [True])
    """
    confidence, agreed = [], []
    for line in map(panel_verdict, lines):
        _, hits = calibration_pairs([line], task)
        raw = line_confidence(line, task) if hits else None
        values = [v for v in (raw.values() if isinstance(raw, dict) else [raw]) if v is not None]
        if values:
            confidence += [min(cmap(v) for v in values)] * len(hits)
            agreed += hits
    return confidence, agreed


def _check_half(report: CalibrationReport, lines: list[dict], task, out_dir: Path) -> None:
    """The check half's figures and diagrams, into ``report``."""
    cmap = report.calibration.map
    raw, agreed = calibration_pairs(lines, task)
    if not raw:
        return
    calibrated = [cmap(r) for r in raw]
    report.ece_raw, report.ece_calibrated = calibration_error(raw, agreed), calibration_error(calibrated, agreed)
    h = report.header
    for name, conf in (("raw", raw), ("calibrated", calibrated)):
        report.diagrams.append(reliability_diagram(
            conf, agreed, out_dir / f"reliability-{name}.png", f"{name} confidence, check half",
            model=h["model"], data=h["data"], split=f"{h['split']}, check half"))
    if report.selection is not None and report.selection.reached:
        confidence, hits = given_pairs(lines, task, cmap)
        given = [a for c, a in zip(confidence, hits) if report.calibration.gives(c)]
        report.coverage = exact_rate(len(given), len(hits))
        report.agreement = exact_rate(sum(given), len(given))


def fit(lines: list[dict], task, fitted_on: dict, *, method: str, level: float | None, risk: float | None):
    """The ``Calibration`` of the calibration half's ``lines``, and the ``Selection`` behind its threshold."""
    raw, agreed = calibration_pairs(lines, task)
    cmap = fit_confidence_map(raw, agreed, method=method)
    fitted_on = {**fitted_on, "n": cmap.n}  # labelled verdicts (pointwise: one per labelled criterion)
    if level is None:
        return Calibration(map=cmap, fitted_on=fitted_on), None
    selection = choose_threshold(*given_pairs(lines, task, cmap), level=level, risk=risk)
    # A level not reached keeps the map and saves no threshold.
    threshold = {"threshold": selection.threshold, "level": level, "risk": risk} if selection.reached else {}
    return Calibration(map=cmap, fitted_on=fitted_on, **threshold), selection


def recorded_seed(card) -> int | None:
    """The split seed a saved evaluator's card records (the split it was tuned on), or None."""
    split = card.get("split") if isinstance(card, dict) else None
    seed = split.get("seed") if isinstance(split, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def split_for(data: DataSpec, seed: int, task) -> DataSpec:
    """``data``'s test split under ``seed``; a file of one's own is read for ``task`` unless a task or format was
    given."""
    own = data.task is None and data.format is None and Path(data.dataset).suffix
    return replace(data, split="test", seed=seed, task=task if own else data.task)


def fitted_on(data: DataSpec, model: str) -> dict:
    """What a map fitted on the calibration half of ``data`` records of it."""
    return {"data": data.dataset if len(data.dataset) <= 200 else data.name,
            "split": f"test (seed {data.seed}), calibration half (seed {data.seed})", "model": model, "seed": data.seed}


def calibrate_judge(judge, program_dir: str | Path, data: DataSpec, *, out_dir: str | Path,
                    level: float | None = None, risk: float | None = None, method: str = "isotonic",
                    seed: int | None = None, concurrency: int = 1, on_item=None) -> CalibrationReport:
    """Fit, choose, save (``calibration.json`` in ``program_dir``) and check the calibration of a loaded ``judge``
    (see the module docstring); the results file and diagrams go to ``out_dir``. ``level`` and ``risk`` come both or
    neither; ``seed`` (the split's and the halves') defaults to the card's, else ``data.seed``.
    """
    from chateval_dspy.deploy.saved.store import save_calibration

    if (level is None) != (risk is None):
        raise ConfigError("give the agreement level and the risk together (--agree-at-least and --risk), or neither")
    seed = recorded_seed(judge.card) if seed is None else seed
    task = judge.config.task_spec
    data = split_for(data, data.seed if seed is None else seed, task)
    out_dir = Path(out_dir)
    parts = calibration_items(data)
    path, lines, resumed = judge_halves(judge, parts, out_dir, concurrency=concurrency, on_item=on_item)
    calibration, selection = fit(lines["calibration"], task, fitted_on(data, judge.lm.model), method=method,
                                 level=level, risk=risk)
    saved = save_calibration(program_dir, calibration)
    n = {half: len(calibration_pairs(lines[half], task)[0]) for half in HALVES}
    header = {"model": judge.lm.model, "data": data.dataset, "split": f"test (seed {data.seed})",
              "items": {half: len(parts[half]) for half in HALVES}}
    report = CalibrationReport(calibration, saved, path, header, n, selection, resumed=resumed)
    _check_half(report, lines["check"], task, out_dir)
    return report


def calibrate(program_dir: str | Path, data: DataSpec, *, out_dir: str | Path, lm: LMSpec | None = None,
              concurrency: int = 1, **options) -> CalibrationReport:
    """``calibrate_judge`` on the evaluator saved at ``program_dir``, loaded on ``lm`` (its model None: the card's).
    ``options``: ``level``, ``risk``, ``method``, ``on_item``."""
    from chateval_dspy.deploy.saved.judge import load

    with load(program_dir, lm=lm, slots=concurrency) as judge:
        return calibrate_judge(judge, program_dir, data, out_dir=out_dir, concurrency=concurrency, **options)


def log_report(report: CalibrationReport, data: DataSpec, *, method: str, uri: str | None = None) -> str:
    """An MLflow run holding the report: params (model, data, split, halves, level, risk, method), the check
    half's figures with their intervals, the calibration file, diagrams and results. Returns its id."""
    params = {"model": report.header["model"], "dataset": data.dataset, "split": report.header["split"],
              "seed": data.seed, "limit": data.limit, "method": method, "n_calibration": report.n["calibration"],
              "n_check": report.n["check"]}
    if report.selection is not None:
        params.update(level=report.selection.level, risk=report.selection.risk,
                      threshold=report.selection.threshold, best_level=report.selection.best_level)
    return log_command("calibrate", "calibration", params, report.metrics(),
                       (report.saved, report.results, *report.diagrams), uri)


def log_command(command: str, folder: str, params: dict, metrics: dict, files, uri: str | None) -> str:
    """An MLflow run of ``command`` holding ``params``, ``metrics`` and ``files`` (under ``folder``); its id."""
    from optim.tracking import runs

    with runs.run(command, params=params, tags={"chateval.command": command}, uri=uri) as active:
        runs.log_metrics(metrics)
        for path in files:
            runs.log_file(path, folder)
        return active.info.run_id
