"""``RunResult``: what a run measured (agreement inputs, cost, abstentions), accumulated record by record.

Abstentions are counted by cause for whole items (``record["abstained"]``) and for single referee turns (the values
of ``record["abstentions"]``: an item can keep its verdict while some referees abstained, which shows a flaky LM).
Dollars are summed per model and are the word ``unpriced``, never 0, when some model is unpriced or a line predates
costs; prompt-cache tokens and withheld verdicts (``needs_person``, left out of agreement): docs/cost.md and
docs/selective.md.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import dataclass, field

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.pricing import CACHE_RATES, UNPRICED, add_usd
from chateval_dspy.program.confidence import NEEDS_PERSON, lowest
from chateval_dspy.run.metrics import pairwise_report, pointwise_report

MODEL_FIGURES = ("calls", "cached_calls", "prompt_tokens", "cached_prompt_tokens", "cache_write_tokens",
                 "completion_tokens", "seconds")


@dataclass
class RunResult:
    """What a run measured. Per-item details live in the results file, not in memory."""

    config: DebateConfig
    n: int = 0
    human: list = field(default_factory=list)
    predicted: list = field(default_factory=list)
    calls: int = 0
    cached_calls: int = 0
    failed_calls: int = 0  # raised or given up on: neither answered nor cached
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # read from the provider's prompt cache: part of prompt_tokens
    cache_write_tokens: int = 0  # written to the provider's prompt cache: part of prompt_tokens
    completion_tokens: int = 0
    seconds: float = 0.0
    wall_seconds: float = 0.0
    consistent: list = field(default_factory=list)
    abstentions: Counter = field(default_factory=Counter)  # whole items, by cause
    referee_abstentions: Counter = field(default_factory=Counter)  # referee turns, by cause
    resumed: int = 0  # records read back from an earlier, interrupted run
    empty: dict = field(default_factory=dict)  # item id -> its judged responses that were empty
    models: dict = field(default_factory=dict)  # model name -> summed calls, tokens, seconds and cost_usd
    uncosted: int = 0  # records without per-model usage (written before costs were recorded)
    unlabelled: int = 0  # items without any human label: counted as missing, never silently dropped
    groups: list = field(default_factory=list)  # document id per labelled item (``group_id``), None when not given
    systems: list = field(default_factory=list)  # system id per labelled item (``system_id``), None when not given
    given: int = 0  # items given a verdict (a prediction)
    needs_person: int = 0  # items whose verdict was withheld: its calibrated confidence was below the threshold
    confidences: list = field(default_factory=list)  # the confidence of each verdict given (pointwise: the lowest)
    calibrated: bool = True  # every confidence counted went through a calibration

    def add(self, record: dict) -> None:
        self.n += 1
        self.given += record["prediction"] is not None
        self._add_confidence(record)
        self.needs_person += record["abstained"] == NEEDS_PERSON
        if record["human"] is None:
            self.unlabelled += 1
        elif record["abstained"] != NEEDS_PERSON:  # a withheld verdict goes to a person: it neither agrees nor not
            self.human.append(record["human"])
            self.predicted.append(record["prediction"])
            self.groups.append(record.get("group_id"))
            self.systems.append(record.get("system_id"))
        for name in (*MODEL_FIGURES, "failed_calls"):  # an older line may lack the cache and failure counts
            setattr(self, name, getattr(self, name) + (record.get(name) or 0))
        if record.get("consistent") is not None:
            self.consistent.append(record["consistent"])
        if record["abstained"]:
            self.abstentions[_cause(record["abstained"])] += 1
        for reason in (record.get("abstentions") or {}).values():
            self.referee_abstentions[_cause(reason)] += 1
        if record.get("empty"):
            self.empty[str(record["id"])] = list(record["empty"])
        self.add_usage(record.get("usage_by_model"))

    def _add_confidence(self, record: dict) -> None:
        """Count the confidence of a verdict given; older lines have none, and a line's figures that are not
        numbers in [0, 1] (a hand-edited file) count as none."""
        confidence = record.get("confidence")
        figures = list(confidence.values()) if isinstance(confidence, dict) else [confidence]
        if record["prediction"] is None or not figures or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in figures):
            return
        self.confidences.append(float(lowest(confidence)))
        self.calibrated = self.calibrated and record.get("confidence_calibrated") is True

    def selective(self) -> dict[str, float]:
        """The run's selective-verdict figures (``cost()`` holds them): ``mean_confidence`` of the verdicts given
        (``mean_raw_confidence`` when some had no calibration) and, when some verdict was withheld, ``coverage`` with
        its exact (Clopper-Pearson) 95% interval.

        Example:
            >>> r = RunResult(DebateConfig())
            >>> for conf, abstained in ((0.9, None), (0.8, None), (0.3, "needs_person")):
            ...     r.add({"human": "1", "prediction": None if abstained else "1", "calls": 2, "prompt_tokens": 0,
            ...            "completion_tokens": 0, "seconds": 0.0, "abstained": abstained, "confidence": conf,
            ...            "confidence_calibrated": True})
            >>> {k: round(v, 3) for k, v in r.selective().items()}  # doctest: +NORMALIZE_WHITESPACE
            {'mean_confidence': 0.85, 'coverage': 0.667, 'coverage_ci_low': 0.094, 'coverage_ci_high': 0.992,
             'needs_person_items': 1.0}
        """
        out = {}
        if self.confidences:
            key = "mean_confidence" if self.calibrated else "mean_raw_confidence"
            out[key] = sum(self.confidences) / len(self.confidences)
        if self.needs_person:
            from scipy import stats

            ci = stats.binomtest(self.given, self.n).proportion_ci(confidence_level=0.95, method="exact")
            out.update(coverage=self.given / self.n, coverage_ci_low=float(ci.low), coverage_ci_high=float(ci.high),
                       needs_person_items=float(self.needs_person))
        return out

    def add_usage(self, used: dict | None) -> None:
        """Add one results line's ``usage_by_model`` to the per-model sums (``add`` does; a report reading a
        results file calls it alone). None (a line written before costs were recorded) makes the run unpriced."""
        if not isinstance(used, dict):
            self.uncosted += 1
            return
        for model, figures in used.items():
            total = self.models.setdefault(model, {**{k: 0 for k in MODEL_FIGURES}, "cost_usd": 0.0})
            for key in MODEL_FIGURES:
                total[key] += figures.get(key) or 0
            total["cost_usd"] = add_usd(total["cost_usd"], figures.get("cost_usd"))
            total["cache_rates"] = common_cache_rates(total.get("cache_rates"), figures.get("cache_rates"))

    def cost_usd(self) -> float | None:
        """The run's cost in US dollars, or None when some model it used is unpriced (or a line has no costs)."""
        if self.uncosted:
            return None
        return functools.reduce(add_usd, (figures["cost_usd"] for figures in self.models.values()), 0.0)

    def model_usage(self) -> dict[str, dict]:
        """Per model, over the run: ``calls``, ``cached_calls``, ``prompt_tokens`` (``cached_prompt_tokens`` and
        ``cache_write_tokens`` among them), ``completion_tokens``, LM ``seconds``, ``cost_usd`` (a number, or
        ``unpriced``) and ``cache_rates`` (``Price.cache_rates``; None when unknown).

        Example:
            >>> r = RunResult(DebateConfig())
            >>> r.add({"human": None, "prediction": "1", "calls": 2, "prompt_tokens": 10, "completion_tokens": 2,
            ...        "seconds": 1.0, "abstained": None, "usage_by_model": {
            ...            "embedded/gemma": {"calls": 1, "prompt_tokens": 6, "completion_tokens": 1, "cost_usd": None},
            ...            "openai/gpt-4o-mini": {"calls": 1, "prompt_tokens": 4, "completion_tokens": 1,
            ...                                   "cost_usd": 1.2e-06}}})
            >>> r.model_usage()["embedded/gemma"]["cost_usd"], r.model_usage()["openai/gpt-4o-mini"]["cost_usd"]
            ('unpriced', 1.2e-06)
            >>> r.cost()["cost_usd_total"]
            'unpriced'
        """
        return {model: {**{k: round(v, 3) if k == "seconds" else v for k, v in figures.items()
                           if k not in ("cost_usd", "cache_rates")},
                        "cost_usd": UNPRICED if figures["cost_usd"] is None else figures["cost_usd"],
                        "cache_rates": figures.get("cache_rates")}
                for model, figures in sorted(self.models.items())}

    def model_metrics(self) -> dict[str, float]:
        """Per-model figures as flat MLflow metrics, ``model/<name>/<figure>`` per item (``cost_usd`` only when
        priced; a name's characters that MLflow refuses become ``.``).

        Example:
            >>> r = RunResult(DebateConfig())
            >>> r.n, r.models = 2, {"openai/gpt-4o-mini": {"calls": 8, "cached_calls": 0, "prompt_tokens": 100,
            ...                      "completion_tokens": 10, "seconds": 1.0, "cost_usd": 0.5}}
            >>> r.model_metrics()["model/openai/gpt-4o-mini/cost_usd_per_item"]
            0.25
        """
        n, out = max(self.n, 1), {}
        for model, figures in sorted(self.models.items()):
            name = _METRIC_UNSAFE.sub(".", model)
            for key, value in figures.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):  # cache_rates is a word
                    out[f"model/{name}/{key}_per_item"] = float(value) / n
        return out

    def metrics(self, seed: int = 0, n_resamples: int | None = None) -> dict:
        """Agreement with the human labels (empty when the items carry none); ``seed`` and ``n_resamples``: the
        bootstrap's (``n_resamples`` None: ``metrics.N_RESAMPLES``)."""
        if not self.human:
            return {}
        if self.config.format == "pairwise":
            report = pairwise_report(self.human, self.predicted, seed=seed, n_resamples=n_resamples)
            return {**report, "label_missing": self.unlabelled} if self.unlabelled else report
        # Levels only when every labelled item names its document (system): a partial grouping would mislead.
        groups = self.groups if self.groups and all(g is not None for g in self.groups) else None
        systems = self.systems if self.systems and all(s is not None for s in self.systems) else None
        return pointwise_report(self.human, self.predicted, seed=seed, task=self.config.task_spec, groups=groups,
                                systems=systems, unlabelled=self.unlabelled, n_resamples=n_resamples)

    def cost(self) -> dict[str, float | str]:
        """Per-item cost figures of the run; ``cost_usd_per_item`` and ``cost_usd_total`` are US dollars, or the
        word ``unpriced`` when some model used has no price (``model_usage`` tells which).
        ``cached_prompt_share`` is the share of prompt tokens read from the provider's prompt cache (NaN
        without prompt tokens). ``failed_calls_per_item`` (calls that raised or were given up on) is there only
        when some failed.

        Example:
            >>> r = RunResult(DebateConfig())
            >>> r.add({"human": None, "prediction": "1", "calls": 2, "prompt_tokens": 10000, "completion_tokens": 500,
            ...        "cached_prompt_tokens": 6000, "seconds": 1.0, "abstained": None})
            >>> c = r.cost()
            >>> c["cached_prompt_tokens_per_item"], c["cache_write_tokens_per_item"], c["cached_prompt_share"]
            (6000.0, 0.0, 0.6)
        """
        n = max(self.n, 1)
        usd = self.cost_usd()
        return {
            "items": self.n,
            "calls_per_item": self.calls / n,
            "cached_calls_per_item": self.cached_calls / n,  # answered by the LM cache: no tokens, no time
            **({"failed_calls_per_item": self.failed_calls / n} if self.failed_calls else {}),
            "prompt_tokens_per_item": self.prompt_tokens / n,
            # The provider's prompt cache, unlike DSPy's: those calls reached the LM and are billed, at cache rates.
            "cached_prompt_tokens_per_item": self.cached_prompt_tokens / n,
            "cache_write_tokens_per_item": self.cache_write_tokens / n,
            "cached_prompt_share": self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else math.nan,
            "completion_tokens_per_item": self.completion_tokens / n,
            "seconds_per_item": self.seconds / n,
            "cost_usd_per_item": UNPRICED if usd is None else round(usd / n, 10),
            "cost_usd_total": UNPRICED if usd is None else usd,
            "wall_seconds": self.wall_seconds,
            "position_consistency": (sum(self.consistent) / len(self.consistent)) if self.consistent else float("nan"),
            "abstained_items": sum(self.abstentions.values()),
            "abstained_referee_turns": sum(self.referee_abstentions.values()),
            **self.selective(),
        }

    def card_cost(self) -> dict:
        """The cost block of a judge card: ``cost()`` without wall time, plus ``by_model`` (``model_usage``)."""
        cost = {k: v for k, v in self.cost().items() if k != "wall_seconds"}
        return {**cost, "by_model": self.model_usage()}

    def abstention_counts(self) -> dict[str, dict[str, int]]:
        """``{"items": {cause: n}, "referee_turns": {cause: n}}``, most frequent first (what the summary shows).

        Example:
            >>> r = RunResult(DebateConfig())
            >>> r.add({"human": "1", "prediction": "1", "calls": 8, "prompt_tokens": 0, "completion_tokens": 0,
            ...        "seconds": 1.0, "abstained": None, "abstentions": {"order1:critic@2": "parse_failure"}})
            >>> r.abstention_counts()
            {'items': {}, 'referee_turns': {'parse_failure': 1}}
        """
        return {"items": dict(self.abstentions.most_common()),
                "referee_turns": dict(self.referee_abstentions.most_common())}

    def abstention_metrics(self) -> dict[str, float]:
        """The counts by cause as flat MLflow metrics: ``abstained_items/<cause>``, ``abstained_referee_turns/<cause>``
        (a cause's characters that MLflow refuses on some systems, such as ``:``, become ``.``), plus the totals.

        Example:
            >>> r = RunResult(DebateConfig())
            >>> r.referee_abstentions.update({"lm_error:deadline": 2})
            >>> r.abstention_metrics()["abstained_referee_turns/lm_error.deadline"]
            2.0
        """
        out = {"abstained_items": float(sum(self.abstentions.values())),
               "abstained_referee_turns": float(sum(self.referee_abstentions.values()))}
        for level, counts in (("abstained_items", self.abstentions), ("abstained_referee_turns", self.referee_abstentions)):
            for cause, n in counts.items():
                key = f"{level}/{_METRIC_UNSAFE.sub('.', cause)}"
                out[key] = out.get(key, 0.0) + n
        return out


_METRIC_UNSAFE = re.compile(r"[^\w.\- /]")


def common_cache_rates(a: str | None, b: str | None) -> str | None:
    """The cache rates two sets of figures both had (``Price.cache_rates`` words); None (unknown) yields to the other.

    A model priced with different rates across lines (a resumed run under another stated price) keeps only the
    rates every line had, so a table's note on tokens priced as input is never missing.

    Example:
        >>> common_cache_rates("read+write", "read"), common_cache_rates(None, "write"), common_cache_rates("read", "write")
        ('read', 'write', 'none')
    """
    if a is None or b is None:
        return b if a is None else a
    kinds = {k for k in ("read", "write") if k in a and k in b}
    return CACHE_RATES[("read" in kinds, "write" in kinds)]


def _cause(reason: str) -> str:
    """The cause of an abstention reason, without any message after ``": "`` (``error:Kind: text`` -> ``error:Kind``)."""
    return str(reason).split(": ")[0]
