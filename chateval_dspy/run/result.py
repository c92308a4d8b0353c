"""``RunResult``: what a run measured (agreement inputs, cost, abstentions), accumulated record by record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from chateval_dspy.config import DebateConfig
from chateval_dspy.run.metrics import pairwise_report, scoring_report


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
    abstentions: Counter = field(default_factory=Counter)
    resumed: int = 0  # records read back from an earlier, interrupted run

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
            self.abstentions[record["abstained"].split(": ")[0]] += 1  # the cause, without the message

    def metrics(self, seed: int = 0) -> dict:
        """Agreement with the human labels (empty when the items carry none)."""
        if not self.human:
            return {}
        if self.config.format == "pairwise":
            return pairwise_report(self.human, self.predicted, seed=seed)
        return scoring_report(self.human, self.predicted, seed=seed)

    def cost(self) -> dict[str, float]:
        n = max(self.n, 1)
        return {
            "items": self.n,
            "calls_per_item": self.calls / n,
            "cached_calls_per_item": self.cached_calls / n,  # answered by the LM cache: no tokens, no time
            "prompt_tokens_per_item": self.prompt_tokens / n,
            "completion_tokens_per_item": self.completion_tokens / n,
            "seconds_per_item": self.seconds / n,
            "wall_seconds": self.wall_seconds,
            "position_consistency": (sum(self.consistent) / len(self.consistent)) if self.consistent else float("nan"),
            "abstained_items": sum(self.abstentions.values()),
        }
