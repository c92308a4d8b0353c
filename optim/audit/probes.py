"""``chateval audit`` as a library: run a loaded panel on a user's items and on their perturbations, and measure
how often each bias moves its verdicts (``measures``), with 95% intervals.

Layout of ``out`` (every results file is ``deploy.scale.score_file``'s, so a rerun judges nothing twice):
``inputs/<name>.jsonl`` the items each run judges; ``<name>.jsonl`` its verdicts (``original``, a probe, or
``original-calibration-off`` / ``swap-calibration-off`` (or ``-on``) for the position probe under the other
calibration setting); ``perturbations.jsonl``; ``audit.json`` the model and panel audited. A rerun makes the
perturbations again and refuses a folder holding other perturbations or another model's or panel's verdicts, so
figures in one folder belong to one set of perturbed items and one panel. A verdict withheld for a person counts as
the verdict the panel gave.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.run.metrics import Estimate
from optim.audit import measures
from optim.audit.perturb import Perturbation, applies, pairwise, pointwise, swap

PERTURBATIONS = "perturbations.jsonl"
MAX_FAMILY_CHARS = 100
CLI_PROBES = ("position", "verbosity", "authority", "bandwagon", "distraction")
# The probes whose figure is a robustness rate (the share of verdicts a perturbation left unchanged): what
# ``--min-robustness`` gates and the search's ``robustness`` objective averages. Position is read as its flip rate.
ROBUSTNESS_PROBES = ("verbosity", "authority", "bandwagon", "distraction")


@dataclass(frozen=True)
class Finding:
    """One audit figure: ``probe``, ``figure`` (its name), ``estimate`` (None with a ``note`` saying why)."""

    probe: str
    figure: str
    estimate: Estimate | None
    note: str = ""


@dataclass
class AuditReport:
    """What ``audit`` measured: model, data, seed, the folder, every finding, and items judged and resumed."""

    model: str
    data: str
    seed: int
    out: Path
    findings: list[Finding] = field(default_factory=list)
    judged: int = 0
    resumed: int = 0

    def lines(self) -> list[str]:
        """One line per figure, each with model, data, n and its 95% interval (or why it has none)."""
        def said(f: Finding) -> str:
            if f.estimate is None:
                return f.note
            if not f.estimate.n:
                return "n/a, no item to measure (n=0)"
            return f"{f.estimate} 95% CI, n={f.estimate.n}" + (f" ({f.note})" if f.note else "")
        where = f"model {self.model} | data {self.data} | seed {self.seed}"
        return [f"{f.probe} {f.figure}: {said(f)} | {where}" for f in self.findings]

    def metrics(self) -> dict[str, Estimate]:
        """Every figure with an estimate, named ``<probe>_<figure>`` for MLflow."""
        return {re.sub(r"[^a-z0-9]+", "_", f"{f.probe} {f.figure}".lower()).strip("_"): f.estimate
                for f in self.findings if f.estimate is not None}

    def robustness(self) -> dict[str, Estimate]:
        """Each probe's robustness rate that was measured on at least one item, by probe."""
        return {f.probe: f.estimate for f in self.findings
                if f.figure == "robustness rate" and f.estimate is not None and f.estimate.n}

    def mean_robustness(self) -> float:
        """The mean of ``robustness()``'s rates (each probe counts once, whatever its n); NaN when none was measured.

        Example:
            >>> report = AuditReport("m", "d", 0, Path("."))
            >>> report.findings = [Finding("verbosity", "robustness rate", Estimate(0.8, 0.6, 0.9, 20)),
            ...                    Finding("authority", "robustness rate", Estimate(0.6, 0.4, 0.8, 20)),
            ...                    Finding("bandwagon", "robustness rate", None, "does not apply")]
            >>> round(report.mean_robustness(), 3)
            0.7
        """
        rates = [e.value for e in self.robustness().values()]
        return sum(rates) / len(rates) if rates else float("nan")


def fields_of(task) -> dict[str, str | None]:
    """A pairwise task's ``question`` (its first input not compared; None without one), ``answer_1``, ``answer_2``.

    Example:
        >>> from chateval_dspy.program.task import builtin_task
        >>> fields_of(builtin_task("pairwise"))
        {'question': 'question', 'answer_1': 'answer_1', 'answer_2': 'answer_2'}
    """
    first, second = task.responses
    question = next((name for name in task.input_names if name not in task.responses), None)
    return {"question": question, "answer_1": first, "answer_2": second}


def verdict_of(record: dict, fmt: str):
    """A results line's verdict, checked: pairwise ``1``/``2``/``tie``/None; pointwise a dict or None."""
    value = record.get("winner") if fmt == "pairwise" else record.get("scores")
    if value is None and record.get("abstained") == "needs_person":
        value = record.get("withheld")  # withheld for a person: still what the panel said
    if fmt == "pairwise" and value not in ("1", "2", "tie", None):
        raise DataError(f"verdict {str(value)[:40]!r} is not 1, 2 or tie", field="winner")
    if fmt != "pairwise" and value is not None and not isinstance(value, dict):
        raise DataError(f"scores must be an object, got {type(value).__name__}", field="scores")
    return value


def judge_into(judge, name: str, records: list[dict], *, out: Path, report: AuditReport, concurrency: int) -> dict:
    """Judge ``records`` into ``out/<name>.jsonl`` (resuming it) and return item id -> verdict, for these records
    only (the file may hold more, from an earlier run on more items)."""
    from chateval_dspy.deploy.scale.score_file import score_file
    from chateval_dspy.run.records import ResultsStream

    src = out / "inputs" / f"{name}.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    results = out / f"{name}.jsonl"
    done = score_file(judge, src, results, concurrency=concurrency)
    report.judged += done.scored
    report.resumed += done.skipped
    verdicts, wanted = {}, {str(r["id"]) for r in records}
    for row, record in enumerate(ResultsStream(results).records, start=1):
        if str(record.get("id")) in wanted:
            try:
                verdicts[str(record["id"])] = verdict_of(record, judge.format)
            except (DataError, KeyError) as exc:
                raise DataError(f"{results} line {row}: {exc}") from None
    return verdicts


def _stored(path: Path) -> dict[tuple[str, str], str]:
    """``(probe, item id) -> its line`` of a stored perturbations file (untrusted: each line must say both)."""
    out = {}
    for row, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            out[(str(record["probe"]), str(record["id"]))] = line
        except (ValueError, TypeError, KeyError):
            raise DataError("not a perturbation line (probe, id, item, changed)", source=str(path), row=row) from None
    return out


def store(out: Path, perturbations: list[Perturbation]) -> None:
    """Add ``perturbations`` to ``perturbations.jsonl``. A folder holding another perturbation of the same probe and
    item (another seed, or other unperturbed verdicts) is refused, so its results are never read against other
    items; probes or items new to the folder are added."""
    path = out / PERTURBATIONS
    stored = _stored(path) if path.is_file() else {}
    lines = dict(stored)
    for p in perturbations:
        line = json.dumps(p.to_dict(), ensure_ascii=False, sort_keys=True)
        key = (p.probe, str(p.item["id"]))
        if stored.get(key, line) != line:
            raise ConfigError(f"{path} holds other perturbations (probe {p.probe}, item {key[1]}: another seed or "
                              "other verdicts): audit into another --out folder, or remove that folder to start again")
        lines[key] = line
    if lines != stored:
        path.write_text("".join(line + "\n" for line in lines.values()), encoding="utf-8")


def check_folder(out: Path, model: str, config: dict) -> None:
    """Write ``audit.json`` (the model and panel whose verdicts the folder holds), or refuse a folder that holds
    another's: its results files would otherwise be resumed as this panel's verdicts."""
    path = out / "audit.json"
    mine = {"model": model, "config": config}
    if path.is_file():
        try:
            theirs = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise DataError("not JSON", source=str(path)) from None
        if theirs != json.loads(json.dumps(mine)):
            raise ConfigError(f"{out} holds an audit of another model or panel ({path}): audit into another --out")
        return
    path.write_text(json.dumps(mine, indent=1, sort_keys=True), encoding="utf-8")


def perturbed(probe: str, records: list[dict], task, seed: int, verdicts: Mapping, labels: Mapping) -> list[Perturbation]:
    """Every item's perturbation by ``probe`` (pairwise: targeted by label and unperturbed verdict)."""
    if task.format != "pairwise":
        return [pointwise(probe, r, task.judged[0], seed) for r in records]
    names = fields_of(task)
    if probe == "swap":
        return [swap(r, (names["answer_1"], names["answer_2"]), seed) for r in records]
    return [pairwise(probe, r, names, seed, verdict=verdicts.get(r["id"]), label=labels.get(r["id"])) for r in records]


def with_calibration(judge, on: bool):
    """``judge``, or a judge of the same program and LM with position calibration ``on`` (or off)."""
    from chateval_dspy.deploy.saved.judge import Judge
    from chateval_dspy.program.chateval import build_evaluator

    if judge.config.calibrate == on:
        return judge
    program = build_evaluator(replace(judge.config, calibrate=on), roles=list(judge.program.roles))
    program.load_state(judge.program.dump_state())
    if getattr(judge.program, "calibration", None) is not None:
        program.calibration = judge.program.calibration
    return Judge(program, judge.card, judge.lm, contextlib.ExitStack(), referee_lms=judge.referee_lms)


def position(judge, records: list[dict], swapped_items: list[Perturbation], judged, original: Mapping) -> list[Finding]:
    """Flip rate under swap, first-position pick rate and position bias, with and without calibration
    (``judged``: ``judge_into`` bound to the audit's folder)."""
    if judge.format != "pairwise":
        return [Finding("position", "flip rate", None, "does not apply to pointwise items (one response, no order)")]
    findings = []
    for on in (judge.config.calibrate, not judge.config.calibrate):
        variant = with_calibration(judge, on)
        suffix = "" if variant is judge else f"-calibration-{'on' if on else 'off'}"
        base = original if variant is judge else judged(variant, f"original{suffix}", records)
        swapped = judged(variant, f"swap{suffix}", [p.item for p in swapped_items])
        probe = f"position ({'calibrated' if on else 'uncalibrated'})"
        first = measures.first_pick_rate(base, swapped)
        findings += [Finding(probe, "flip rate", measures.flip_rate(base, swapped),
                             "decisive pairs whose swapped verdict names another answer"),
                     Finding(probe, "first-position pick rate", first, "decisive verdicts, both orders"),
                     Finding(probe, "position bias", measures.position_bias(first), "2 x first-position rate - 1")]
    return findings


def text_probe(probe: str, judge, made: list[Perturbation], judged, original: Mapping, seed: int) -> list[Finding]:
    """A text-adding probe: pairwise, the share moving towards the boosted answer and the robustness rate;
    pointwise, each numeric criterion's mean score shift and the robustness rate."""
    if not applies(probe, judge.format):
        return [Finding(probe, "robustness rate", None, "does not apply to pointwise items (it needs two answers)")]
    after = judged(judge, probe, [p.item for p in made])
    if judge.format == "pairwise":
        boosted = {p.item["id"]: p.changed["target"] for p in made}
        moved, same = measures.towards(original, after, boosted)
        basis = sorted({p.changed["basis"] for p in made})
        return [Finding(probe, "towards boosted", moved, f"target chosen by {'/'.join(basis)}"),
                Finding(probe, "robustness rate", same)]
    found = [Finding(probe, f"score shift {c.name}", measures.score_shift(original, after, c.name, seed))
             for c in judge.task.criteria if c.scale.ordinal]
    return found + [Finding(probe, "robustness rate", measures.robustness(original, after))]


def family_of(model: str) -> str:
    """A model's family, for self-preference: the leading letters of its name after any provider prefix.

    Example:
        >>> family_of("openai/gpt-4o-mini"), family_of("anthropic/claude-3-5-haiku"), family_of("embedded")
        ('gpt', 'claude', 'embedded')
    """
    name = model.rsplit("/", 1)[-1].lower()
    found = re.match(r"[a-z]+", name)
    return found.group(0) if found else name


def extras(original: Mapping, labels: Mapping, *, model: str, families: Mapping | None = None,
           judge_family: str | None = None, bias_types: Mapping | None = None) -> list[Finding]:
    """Self-preference (with ``families``) and accuracy per bias type (with ``bias_types``) on the originals."""
    found = []
    if families is not None:
        own = (judge_family or family_of(model)).lower()[:MAX_FAMILY_CHARS]
        fams = {i: tuple(str(f).lower()[:MAX_FAMILY_CHARS] for f in pair) for i, pair in families.items()}
        pref = measures.self_preference(original, fams, own, labels)
        found += [Finding("self-preference", "panel picks own family", pref["panel"], f"judge family {own}"),
                  Finding("self-preference", "people pick own family", pref["people"], f"judge family {own}")]
    if bias_types is not None:
        for kind, est in measures.accuracy_by_type(original, labels, bias_types).items():
            found.append(Finding("bias type", f"accuracy {kind[:MAX_FAMILY_CHARS]}", est, "known-correct pairs"))
    return found


def check_probes(probes) -> tuple[str, ...]:
    unknown = [p for p in probes if p not in CLI_PROBES]
    if unknown or not probes:
        raise ConfigError(f"unknown probe(s) {', '.join(map(repr, unknown)) or '(none given)'}; choose from: "
                          f"{', '.join(CLI_PROBES)}")
    return tuple(probes)


def audit(judge, items, *, out: str | Path, probes=CLI_PROBES, seed: int = 0, concurrency: int = 1,
          data: str = "items", **columns) -> AuditReport:
    """Run the bias audit of a loaded ``judge`` on ``items`` (its task's ``dspy.Example`` items) into ``out``.

    ``seed`` seeds the perturbations and the bootstrap; ``data`` names the items in the report. ``columns``:
    ``families`` (item id -> (model family of answer 1, of answer 2): adds self-preference), ``judge_family``
    (default: ``family_of`` the model's name), ``bias_types`` (item id -> bias type, on pairs with a known-correct
    label: adds accuracy per type).
    """
    probes = check_probes(probes)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(getattr(judge.lm, "model", None) or judge.card.get("model") or "unknown")  # the LM bound, not the card's
    report = AuditReport(model=model, data=data, seed=seed, out=out)
    check_folder(out, model, judge.config.to_dict())
    records = [{"id": str(x.id), **{name: x[name] for name in judge.task.input_names}} for x in items]
    labels = {str(x.id): x.get("label") for x in items}  # pairwise human labels, None without one
    judged = functools.partial(judge_into, out=out, report=report, concurrency=concurrency)
    original = judged(judge, "original", records)
    made = {probe: perturbed("swap" if probe == "position" else probe, records, judge.task, seed, original, labels)
            for probe in probes if applies("swap" if probe == "position" else probe, judge.format)}
    store(out, [p for probe in probes for p in made.get(probe, [])])  # before judging: a changed set is refused
    for probe in probes:
        if probe == "position":
            report.findings += position(judge, records, made.get(probe, []), judged, original)
        else:
            report.findings += text_probe(probe, judge, made.get(probe, []), judged, original, seed)
    report.findings += extras(original, labels, model=model, **columns)
    return report
