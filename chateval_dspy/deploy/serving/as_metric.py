"""A loaded evaluator as the metric of another DSPy program: ``as_metric(judge, inputs=..., reference=...)`` is
``metric(example, prediction, trace=None)`` for ``dspy.Evaluate`` and DSPy's optimizers (docs/production.md, "As a
metric for another DSPy program", tells the scoring).

A judge that does not calibrate position is asked in both orders and the outcomes averaged. No verdict, or a blank
judged text, scores 0.0 (logged, counted in ``metric.abstentions``); a field that cannot be found is a
``ConfigError``. GEPA's feedback call (``pred_name``) gets the referees' evidence as feedback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import dspy

from chateval_dspy.deploy.saved.judge import Judge, Verdict
from chateval_dspy.errors import ConfigError, DataError, shown

log = logging.getLogger(__name__)

ROOTS = ("example", "prediction")
# What a pairwise winner is worth to the program, by the slot its answer sat in ("1" first, "2" second).
OUTCOME = {"1": {"1": 1.0, "tie": 0.5, "2": 0.0}, "2": {"2": 1.0, "tie": 0.5, "1": 0.0}}
MAX_FEEDBACK_CHARS = 4000

Inputs = Mapping[str, str] | Callable[[dspy.Example, dspy.Prediction], Mapping[str, object]]


@dataclass(frozen=True)
class MetricScale:
    """How the metric reads one criterion: a numeric range ``low..high``, or labels whose ``good`` ones count 1.

    Example:
        >>> MetricScale(low=1, high=3).normalise(2.5)
        0.75
        >>> MetricScale(labels=("no", "partly", "yes"), good=frozenset({"yes"})).normalise("partly")
        0.0
    """

    low: float | None = None
    high: float | None = None
    labels: tuple[str, ...] = ()
    good: frozenset[str] = frozenset()

    @classmethod
    def of(cls, name: str, spec) -> MetricScale:
        """A scale from ``(low, high)`` numbers, a sequence of labels (``scales=`` values, ``Literal`` points),
        or a task spec's scale (an object with ``low``/``high`` or ``labels``)."""
        if isinstance(spec, MetricScale):
            return spec
        if getattr(spec, "labels", None):
            return cls(labels=tuple(map(str, spec.labels)))
        if _is_number(getattr(spec, "low", None)) and _is_number(getattr(spec, "high", None)):
            spec = (spec.low, spec.high)
        points = tuple(spec) if isinstance(spec, Iterable) and not isinstance(spec, (str, bytes)) else ()
        if len(points) < 2:
            raise ConfigError(f"scale of {name!r} must be (low, high) numbers or at least two labels, got {shown(spec, 80)}")
        if all(_is_number(p) for p in points):
            low, high = float(min(points)), float(max(points))
            if low == high:
                raise ConfigError(f"scale of {name!r} has a single point ({low:g}); it cannot rank anything")
            return cls(low=low, high=high)
        return cls(labels=tuple(str(p) for p in points))

    @property
    def numeric(self) -> bool:
        return self.low is not None

    def normalise(self, value) -> float:
        """``value`` on 0..1: linear on a numeric scale (clamped), 1 or 0 for a good or other label."""
        if self.numeric:
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise ConfigError(f"a numeric scale {self.low:g}..{self.high:g} got the label {shown(value, 40)}; "
                                      "declare the criterion's labels with scales=") from None
            return min(1.0, max(0.0, (float(value) - self.low) / (self.high - self.low)))
        return 1.0 if any(_same_label(value, label) for label in self.good) else 0.0


def scales_of(program: dspy.Module) -> dict[str, MetricScale]:
    """An evaluator's criteria and their scales (its task spec's).

    Example:
        >>> from chateval_dspy.config import DebateConfig
        >>> from chateval_dspy.program.chateval import build_evaluator
        >>> program = build_evaluator(DebateConfig(format="pointwise", roles=("critic",)))
        >>> found = scales_of(program)
        >>> found["naturalness"], found["groundedness"].high
        (MetricScale(low=1.0, high=3.0, labels=(), good=frozenset()), 1.0)
    """
    return {c.name: MetricScale.of(c.name, c.scale) for c in program.config.task_spec.criteria}


def pointwise_value(scores: Mapping[str, object] | None, scales: Mapping[str, MetricScale],
                    criteria: Iterable[str] | None = None) -> float | None:
    """The mean over ``criteria`` (default: every scored one) of each score on 0..1; None when none was scored.

    Example:
        >>> scales = {"coherence": MetricScale(low=1, high=3),
        ...           "safe": MetricScale(labels=("no", "yes"), good=frozenset({"yes"}))}
        >>> pointwise_value({"coherence": 3, "safe": "no"}, scales)
        0.5
        >>> pointwise_value({"coherence": None, "safe": None}, scales) is None
        True
    """
    if not scores:
        return None
    parts = []
    for name in (list(scores) if criteria is None else criteria):
        value = scores.get(name)
        if value is None:  # that criterion got no verdict: the others still decide
            continue
        if name not in scales:
            raise ConfigError(f"the judge scored {name!r}, whose scale is unknown: pass as_metric(scales="
                              f"{{{name!r}: (low, high) or [labels]}})")
        parts.append(scales[name].normalise(value))
    return sum(parts) / len(parts) if parts else None


@dataclass(frozen=True)
class MetricResult:
    """What the metric made of one (example, prediction): its value, the verdicts behind it, any abstention."""

    value: float
    verdicts: tuple[Verdict, ...]
    abstained: str | None = None


class JudgeMetric:
    """A DSPy metric backed by a loaded ChatEval judge (build it with ``as_metric``); ``result()`` returns the value
    with its verdicts. ``judged`` counts judge calls made, ``cache_hits`` those answered from the cache,
    ``abstentions`` the 0.0 scores given for want of a verdict, by reason."""

    __name__ = "chateval_metric"  # what dspy.Evaluate and optimizers print for a metric

    def __init__(self, judge: Judge, fields: Callable, reference: Callable | None, *, must_have_text: frozenset[str],
                 scales: dict[str, MetricScale], criteria: tuple[str, ...] | None, threshold: float, cache_size: int):
        self.judge, self._fields, self._reference = judge, fields, reference
        self.pairwise = reference is not None
        self.responses = tuple(judge.config.task_spec.responses) if self.pairwise else ()
        self.scales, self.criteria, self.threshold = scales, criteria, threshold
        self._must_have_text = must_have_text
        # A judge that calibrates position pools both answer orders itself; otherwise the metric does.
        self.slots = ("1",) if not self.pairwise or judge.config.calibrate else ("1", "2")
        self._cache: OrderedDict[tuple, Verdict] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.judged = 0
        self.cache_hits = 0
        self.abstentions: Counter[str] = Counter()

    def __call__(self, example, prediction, trace=None, pred_name=None, pred_trace=None):
        """The score of ``prediction`` for ``example``: a float, a bool when ``trace`` is given (bootstrapping),
        or ``dspy.Prediction(score, feedback)`` for GEPA's per-predictor feedback call (``pred_name`` given)."""
        result = self.result(example, prediction)
        if pred_name is not None:
            return dspy.Prediction(score=result.value, feedback=self.feedback(result))
        if trace is not None:
            return result.value >= self.threshold
        return result.value

    def result(self, example, prediction) -> MetricResult:
        """Judge one (example, prediction) pair, or answer it from the cache."""
        item = {name: "" if value is None else str(value) for name, value in self._item(example, prediction).items()}
        blank = sorted(name for name in self._must_have_text if name in item and not item[name].strip())
        if blank:  # nothing to judge: a blank answer scores as a failed one, without paying the panel
            return self._abstain(item, f"blank:{','.join(blank)}", ())
        if not self.pairwise:
            verdict = self._judge(item)
            value = pointwise_value(verdict.scores, self.scales, self.criteria)
            if value is None:
                return self._abstain(item, verdict.abstained or "no_verdict", (verdict,))
            return MetricResult(value, (verdict,))
        ours, reference = self.responses
        values, verdicts = [], []
        for slot in self.slots:  # "1": the program's answer first; "2": the reference first
            first, second = (item[ours], item[reference]) if slot == "1" else (item[reference], item[ours])
            verdict = self._judge({**item, ours: first, reference: second})
            verdicts.append(verdict)
            if verdict.winner is not None:
                values.append(OUTCOME[slot][verdict.winner])
        if not values:
            return self._abstain(item, verdicts[0].abstained or "no_verdict", tuple(verdicts))
        return MetricResult(sum(values) / len(values), tuple(verdicts))

    def feedback(self, result: MetricResult) -> str:
        """The verdict in words, with each referee's evidence (GEPA reflects on this text)."""
        if result.abstained:
            return f"The judge panel gave no verdict ({result.abstained}), so this scores 0."
        if self.pairwise:
            ours, reference = self.responses
            head = (f"Compared with the reference answer, the judge panel scored this answer {result.value:g} "
                    f"(1 = better, 0.5 = as good, 0 = worse). Below, {ours} is this answer and {reference} the "
                    "reference; after a ' / ' a referee judged them in the swapped order.")
        else:
            head = f"The judge panel's scores: {json.dumps(result.verdicts[0].scores)} (overall {result.value:.2f} of 1)."
        lines = [head] + [f"- {referee}: {' / '.join(texts)}" for referee, texts in result.verdicts[0].rationales.items()]
        return "\n".join(lines)[:MAX_FEEDBACK_CHARS]

    def _item(self, example, prediction) -> dict:
        item = dict(self._fields(example, prediction))
        if self.pairwise:
            ours, reference = self.responses
            if reference in item or ours not in item:
                raise ConfigError(f"pairwise as_metric(inputs=...) must give {ours!r} (the program's answer) and not "
                                  f"{reference!r} (the reference, named by reference=); it gave {sorted(item)}")
            item[reference] = self._reference(example, prediction)
        return item

    def _judge(self, item: dict) -> Verdict:
        key = tuple(sorted(item.items()))
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                return self._cache[key]
        item_id = "metric-" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
        try:
            # trace=None: the panel's own predictor calls must not land in the trace of the program being
            # bootstrapped (DSPy would offer them as demos of predictors it cannot find).
            with dspy.context(trace=None):
                verdict = self.judge({**item, "id": item_id}, source="as_metric")
        except DataError as exc:
            raise ConfigError(f"as_metric: the item built from inputs= is not a valid {self.judge.format} item "
                              f"({exc}); the judge was given fields {sorted(item)}") from exc
        with self._lock:
            self.judged += 1
            if self._cache_size:
                self._cache[key] = verdict
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return verdict

    def _abstain(self, item: dict, reason: str, verdicts: tuple[Verdict, ...]) -> MetricResult:
        with self._lock:
            self.abstentions[reason] += 1
        shown = {k: (v[:60] + "...") if len(v) > 60 else v for k, v in item.items()}
        log.warning("as_metric: no verdict (%s) for %s; scored 0.0", reason, shown)
        return MetricResult(0.0, verdicts, abstained=reason)


def as_metric(judge: Judge, *, inputs: Inputs, reference: str | Callable | None = None,
              criteria: Iterable[str] | None = None, scales: Mapping[str, object] | None = None,
              good: Mapping[str, str | Iterable[str]] | None = None, threshold: float = 0.5,
              cache_size: int = 4096) -> JudgeMetric:
    """A DSPy metric ``(example, prediction, trace=None) -> float`` that asks ``judge``.

    Args:
        judge: A loaded evaluator; it runs on its own LM, whatever LM the scored program uses.
        inputs: The judged item's fields: a mapping of the judge's field name to ``"example.<field>"`` or
            ``"prediction.<field>"`` (dotted paths go deeper), or a callable ``(example, prediction) -> dict``.
            Pairwise: the shared fields and the first response, which is the program's answer.
        reference: Pairwise only, and required there: where the reference answer is (a path or a callable).
        criteria: Pointwise: the criteria to average (default: every criterion the panel scores).
        scales: Pointwise: ``{criterion: (low, high)}`` or ``{criterion: [labels]}``, adding to or overriding
            the judge's.
        good: Pointwise: ``{criterion: label or labels}`` that count as 1 (required for each label criterion
            averaged).
        threshold: With ``trace`` given, the metric returns ``value >= threshold`` (0.5 passes a tie).
        cache_size: Verdicts kept, one per judged item; 0: no cache.

    Example:
        >>> import dspy
        >>> import chateval_dspy as ce
        >>> from chateval_dspy.deploy.saved.card import make_card
        >>> from chateval_dspy.deploy.saved.store import save_program
        >>> program = ce.build_evaluator(ce.DebateConfig(roles=("critic",), turns=1))
        >>> path = save_program(program, tmp / "judge", make_card(program, model="openai-compatible/fake-served"))
        >>> judge = ce.load(path, lm=ce.LMSpec(model=fake_url, cache=False))
        >>> metric = as_metric(judge, inputs={"question": "example.question", "answer_1": "prediction.answer"},
        ...                    reference="example.answer")
        >>> gold = dspy.Example(question="What is 2+2?", answer="4").with_inputs("question")
        >>> metric(gold, dspy.Prediction(answer="4, since two plus two makes four."))  # the fake LM prefers detail
        1.0
        >>> metric(gold, dspy.Prediction(answer="4, since two plus two makes four."), trace=[]), metric.judged
        (True, 1)
        >>> judge.close()
    """
    fields = _fields(inputs)
    if not _is_number(threshold) or not 0 <= threshold <= 1:
        raise ConfigError(f"threshold must be a number in 0..1, got {shown(threshold, 40)}")
    if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
        raise ConfigError(f"cache_size must be a count >= 0, got {shown(cache_size, 40)}")
    from_program = {name for name, path in inputs.items() if isinstance(path, str) and path.startswith("prediction.")} \
        if isinstance(inputs, Mapping) else set()
    if judge.format == "pairwise":
        return _pairwise_metric(judge, inputs, fields, reference, criteria, scales, good, from_program, threshold,
                                cache_size)
    if reference is not None:
        raise ConfigError("reference= is for pairwise judges; a pointwise judge scores the program's output alone")
    found, chosen = _pointwise_scales(judge, criteria, scales, good)
    judged = set(judge.config.task_spec.judged) or {"response"}  # a task marking none: the built-in task's field
    return JudgeMetric(judge, fields, None, must_have_text=frozenset(from_program | judged), scales=found,
                       criteria=chosen, threshold=float(threshold), cache_size=cache_size)


def _pairwise_metric(judge, inputs, fields, reference, criteria, scales, good, from_program, threshold,
                     cache_size) -> JudgeMetric:
    """``as_metric`` for a pairwise judge: the program's answer against the reference."""
    ours, theirs = judge.config.task_spec.responses
    if reference is None:
        raise ConfigError("a pairwise judge compares the program's answer with a reference: pass reference= "
                          "(e.g. reference=\"example.answer\")")
    if isinstance(inputs, Mapping) and (ours not in inputs or theirs in inputs):
        raise ConfigError(f"pairwise inputs= must name {ours!r} (the program's answer) and not {theirs!r} "
                          f"(the reference, given by reference=); got {sorted(inputs)}")
    if criteria is not None or scales or good:
        raise ConfigError("criteria=, scales= and good= are for pointwise judges; a pairwise metric scores "
                          "win 1, tie 0.5, loss 0")
    return JudgeMetric(judge, fields, _getter(reference, "reference"),
                       must_have_text=frozenset(from_program | {ours, theirs}), scales={}, criteria=None,
                       threshold=float(threshold), cache_size=cache_size)


def _pointwise_scales(judge, criteria, scales, good) -> tuple[dict, tuple | None]:
    """A pointwise metric's scales (the judge's, and those given) with their good labels, and the criteria chosen."""
    found = scales_of(judge.program)
    found.update({name: MetricScale.of(name, spec) for name, spec in (scales or {}).items()})
    chosen = None if criteria is None else tuple(criteria)
    unknown = [c for c in chosen or () if c not in found]
    if unknown:
        raise ConfigError(f"criteria {unknown} have no known scale (the judge's are {sorted(found)}); "
                          "declare them with scales=")
    for name, labels in (good or {}).items():
        if name not in found or found[name].numeric:
            raise ConfigError(f"good= names {name!r}, which is not a label criterion (label criteria: "
                              f"{sorted(n for n, s in found.items() if not s.numeric)})")
        wanted = frozenset([labels] if isinstance(labels, str) else map(str, labels))
        if not wanted <= set(found[name].labels):
            raise ConfigError(f"good labels {sorted(wanted - set(found[name].labels))} of {name!r} are not on its "
                              f"scale {list(found[name].labels)}")
        found[name] = MetricScale(labels=found[name].labels, good=wanted)
    missing = [n for n, s in found.items() if not s.numeric and not s.good and (chosen is None or n in chosen)]
    if missing:
        raise ConfigError(f"label criteria {missing} need their good label(s): pass good={{criterion: label}}")
    return found, chosen


def _fields(inputs: Inputs) -> Callable:
    if callable(inputs):
        def call(example, prediction) -> Mapping:
            out = inputs(example, prediction)
            if not isinstance(out, Mapping):
                raise ConfigError(f"as_metric(inputs=callable) must return a dict of field -> text, got "
                                  f"{type(out).__name__}")
            return out
        return call
    if not isinstance(inputs, Mapping) or not inputs:
        raise ConfigError("inputs= must map the judge's fields to 'example.<field>' / 'prediction.<field>', "
                          "or be a callable (example, prediction) -> dict")
    getters = {name: _getter(path, f"inputs[{name!r}]") for name, path in inputs.items()}
    return lambda example, prediction: {name: get(example, prediction) for name, get in getters.items()}


def _getter(path, where: str) -> Callable:
    """``(example, prediction) -> value`` for a callable or an ``example.``/``prediction.`` path."""
    if callable(path):
        return path
    root, _, rest = path.partition(".") if isinstance(path, str) else ("", "", "")
    if root not in ROOTS or not rest:
        raise ConfigError(f"{where} must be 'example.<field>' or 'prediction.<field>' (or a callable), got {shown(path, 80)}")
    parts = rest.split(".")

    def get(example, prediction):
        value = example if root == "example" else prediction
        for part in parts:
            try:
                value = value[part]
            except (KeyError, IndexError, TypeError):
                if not hasattr(value, part):
                    keys = list(value.keys()) if hasattr(value, "keys") else []
                    raise ConfigError(f"as_metric: {path} not found ({type(value).__name__} has no {part!r}"
                                      f"{'; it has ' + ', '.join(map(str, keys)) if keys else ''})") from None
                value = getattr(value, part)
        return value
    return get


def _same_label(value, label: str) -> bool:
    """A label matches itself, and a number matches a label that reads as that number (a mean of 1s is 1.0)."""
    if str(value) == label:
        return True
    try:
        return _is_number(value) and float(label) == value
    except ValueError:
        return False


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
