"""``RunResult``: what a run measured (agreement inputs, cost, abstentions), accumulated record by record.

Abstentions are counted at two levels, by cause: whole items without a verdict (``record["abstained"]``)
and single referee turns that gave none (the values of ``record["abstentions"]``). An item can keep its
verdict while some of its referees abstained, so the second count is the one that shows a flaky LM.

Cost in US dollars is summed per model (``record["usage_by_model"]``). A run's dollar figures are numbers
only when every model it used is priced; otherwise they are the word ``unpriced``, never 0. Lines written
before costs were recorded (no ``usage_by_model``) make the run's dollars ``unpriced`` too.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.pricing import UNPRICED, add_usd
from chateval_dspy.run.metrics import pairwise_report, scoring_report

MODEL_FIGURES = ("calls", "cached_calls", "prompt_tokens", "completion_tokens", "seconds")


@dataclass
class RunResult:
    """What a run measured. Per-item details live in the results file, not in memory."""

    config: DebateConfig
    n: int = 0
    human: list = field(default_factory=list)
    predicted: list = field(default_factory=list)
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
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

    def add(self, record: dict) -> None:
        self.n += 1
        if record["human"] is not None:
            self.human.append(record["human"])
            self.predicted.append(record["prediction"])
        self.calls += record["calls"] or 0
        self.cached_calls += record.get("cached_calls") or 0
        self.prompt_tokens += record["prompt_tokens"]
        self.completion_tokens += record["completion_tokens"]
        self.seconds += record["seconds"]
        if record.get("consistent") is not None:
            self.consistent.append(record["consistent"])
        if record["abstained"]:
            self.abstentions[_cause(record["abstained"])] += 1
        for reason in (record.get("abstentions") or {}).values():
            self.referee_abstentions[_cause(reason)] += 1
        if record.get("empty"):
            self.empty[str(record["id"])] = list(record["empty"])
        used = record.get("usage_by_model")
        if not isinstance(used, dict):
            self.uncosted += 1
            return
        for model, figures in used.items():
            total = self.models.setdefault(model, {**{k: 0 for k in MODEL_FIGURES}, "cost_usd": 0.0})
            for key in MODEL_FIGURES:
                total[key] += figures.get(key) or 0
            total["cost_usd"] = add_usd(total["cost_usd"], figures.get("cost_usd"))

    def cost_usd(self) -> float | None:
        """The run's cost in US dollars, or None when some model it used is unpriced (or a line has no costs)."""
        if self.uncosted:
            return None
        total: float | None = 0.0
        for figures in self.models.values():
            total = add_usd(total, figures["cost_usd"])
        return total

    def model_usage(self) -> dict[str, dict]:
        """Per model, over the run: ``calls``, ``cached_calls``, ``prompt_tokens``, ``completion_tokens``, LM
        ``seconds`` and ``cost_usd`` (a number, or ``unpriced``).

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
        return {model: {**{k: round(v, 3) if k == "seconds" else v for k, v in figures.items() if k != "cost_usd"},
                        "cost_usd": UNPRICED if figures["cost_usd"] is None else figures["cost_usd"]}
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
                if value is not None:
                    out[f"model/{name}/{key}_per_item"] = float(value) / n
        return out

    def metrics(self, seed: int = 0) -> dict:
        """Agreement with the human labels (empty when the items carry none)."""
        if not self.human:
            return {}
        if self.config.format == "pairwise":
            return pairwise_report(self.human, self.predicted, seed=seed)
        return scoring_report(self.human, self.predicted, seed=seed, task=self.config.task_spec)

    def cost(self) -> dict[str, float | str]:
        """Per-item cost figures of the run; ``cost_usd_per_item`` and ``cost_usd_total`` are US dollars, or the
        word ``unpriced`` when some model used has no price (``model_usage`` tells which)."""
        n = max(self.n, 1)
        usd = self.cost_usd()
        return {
            "items": self.n,
            "calls_per_item": self.calls / n,
            "cached_calls_per_item": self.cached_calls / n,  # answered by the LM cache: no tokens, no time
            "prompt_tokens_per_item": self.prompt_tokens / n,
            "completion_tokens_per_item": self.completion_tokens / n,
            "seconds_per_item": self.seconds / n,
            "cost_usd_per_item": UNPRICED if usd is None else round(usd / n, 10),
            "cost_usd_total": UNPRICED if usd is None else usd,
            "wall_seconds": self.wall_seconds,
            "position_consistency": (sum(self.consistent) / len(self.consistent)) if self.consistent else float("nan"),
            "abstained_items": sum(self.abstentions.values()),
            "abstained_referee_turns": sum(self.referee_abstentions.values()),
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


def _cause(reason: str) -> str:
    """The cause of an abstention reason, without any message after ``": "`` (``error:Kind: text`` -> ``error:Kind``)."""
    return str(reason).split(": ")[0]
