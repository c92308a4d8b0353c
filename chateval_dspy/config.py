"""The one configuration object a run is built from.

The CLI, an Optuna trial, MLflow params and a saved judge card all carry the
same ``DebateConfig``, so any run can be rebuilt from what it logged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from chateval_dspy.errors import ConfigError

Format = Literal["pairwise", "scoring"]
AGGREGATES = ("mean", "majority")


@dataclass(frozen=True)
class DebateConfig:
    """How a panel of referees debates one item.

    Args:
        format: ``pairwise`` (which of two answers is better) or ``scoring`` (per-aspect scores).
        roles: Role slugs from the role library, one per referee, in speaking order.
        strategy: A key of ``strategies.STRATEGIES``.
        turns: Rounds of talk; the last round is the verdict round.
        calibrate: Pairwise only: judge both answer orders and combine them.
        aggregate: ``mean`` of scores (the paper's default) or ``majority`` vote of preferences.
        parse_retries: Extra attempts when a verdict will not parse, before it becomes an abstention.
        max_text_chars: Longer judged texts are cut to this many characters, with a warning.
        consensus_stop: Every round ends in scores and the debate stops once all referees agree
            (fewer calls; ``calls_per_item`` is then the most an item can cost).
        weighted_scores: Ask the LM for log-probabilities and use each score's expected value
            (G-Eval style) in the mean; the integer score is kept when the LM returns none.
        role_file: Extra personas (YAML/JSON), resolved when the program is built.

    Example:
        >>> cfg = DebateConfig(format="pairwise", roles=("general_public", "critic"))
        >>> cfg.calls_per_item()
        8
    """

    format: Format = "pairwise"
    roles: tuple[str, ...] = ("general_public", "critic")
    strategy: str = "one_by_one"
    turns: int = 2
    calibrate: bool = True
    aggregate: str = "mean"
    parse_retries: int = 1
    max_text_chars: int = 6000
    consensus_stop: bool = False
    weighted_scores: bool = False
    role_file: str | None = field(default=None)

    def __post_init__(self) -> None:
        from chateval_dspy.program.strategies import STRATEGIES

        if self.format not in ("pairwise", "scoring"):
            raise ConfigError(f"unknown format {self.format!r}; choose one of: pairwise, scoring")
        if not self.roles:
            raise ConfigError("a debate needs at least one role")
        if len(set(self.roles)) != len(self.roles):
            raise ConfigError(f"roles must be distinct, got {list(self.roles)}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of: {', '.join(STRATEGIES)}")
        if not isinstance(self.turns, int) or self.turns < 1:
            raise ConfigError(f"turns must be a positive integer, got {self.turns!r}")
        if self.aggregate not in AGGREGATES:
            raise ConfigError(f"unknown aggregate {self.aggregate!r}; choose one of: {', '.join(AGGREGATES)}")
        if self.parse_retries < 0:
            raise ConfigError(f"parse_retries must be >= 0, got {self.parse_retries}")
        if self.max_text_chars < 200:
            raise ConfigError(f"max_text_chars must be at least 200, got {self.max_text_chars}")
        object.__setattr__(self, "roles", tuple(self.roles))

    @property
    def orders(self) -> int:
        """How many answer orders each item is judged in."""
        return 2 if (self.calibrate and self.format == "pairwise") else 1

    def calls_per_item(self) -> int:
        """LM calls one item costs when every call parses on the first try (at most, with ``consensus_stop``)."""
        from chateval_dspy.program.strategies import STRATEGIES

        summaries = (self.turns - 1) if STRATEGIES[self.strategy].summarize else 0
        return self.orders * (len(self.roles) * self.turns + summaries)

    def to_dict(self) -> dict:
        """Plain values for JSON, MLflow params and the judge card."""
        out = asdict(self)
        out["roles"] = list(self.roles)
        return out

    def changes(self) -> dict:
        """The fields that differ from the defaults for this format (``format`` itself always included).

        Run keys and study settings are built from these, so that a field added later with a default
        that keeps the old behaviour does not orphan existing results files or studies.
        """
        defaults = DebateConfig(format=self.format).to_dict()
        return {k: v for k, v in self.to_dict().items() if k == "format" or v != defaults[k]}

    @classmethod
    def from_dict(cls, data: dict) -> DebateConfig:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        if "roles" in known:
            known["roles"] = tuple(known["roles"])
        return cls(**known)

    def replace(self, **changes) -> DebateConfig:
        return replace(self, **changes)
