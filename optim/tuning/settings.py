"""What a compile is asked for: the optimizer's name, its budget and the knobs the optimizers share. Plain data,
without DSPy or Optuna, so that ``--help`` states the choices and defaults that ``optim.tuning.compile`` uses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from chateval_dspy import limits
from chateval_dspy.errors import ConfigError
from chateval_dspy.limits import DEFAULT_DEMOS

OPTIMIZERS = ("labeled", "bootstrap", "bootstrap_rs", "mipro", "gepa", "simba")
BUDGETS = ("light", "medium", "heavy")


@dataclass(frozen=True)
class OptimizerSettings:
    """Knobs shared by the optimizers (each uses those that apply to it); logged and put on the card.
    ``candidates``: candidate programs (bootstrap_rs, simba; simba's steps too); ``auto``: the MIPROv2/GEPA budget;
    ``threads``: items an optimizer evaluates at once.

    Example:
        >>> OptimizerSettings(max_demos=1).to_dict()["max_demos"]
        1
    """

    max_demos: int = DEFAULT_DEMOS
    candidates: int = 4
    auto: str = "light"
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.max_demos <= limits.MAX_DEMOS_PER_PREDICTOR:
            raise ConfigError(f"max_demos must lie in 0..{limits.MAX_DEMOS_PER_PREDICTOR} "
                              f"(limits.MAX_DEMOS_PER_PREDICTOR), got {self.max_demos}")
        if self.candidates < 1:
            raise ConfigError(f"candidates must be positive, got {self.candidates}")
        if self.auto not in BUDGETS:
            raise ConfigError(f"unknown auto budget {self.auto!r}; choose one of: {', '.join(BUDGETS)}")
        if self.threads < 1:
            raise ConfigError(f"threads must be positive, got {self.threads}")

    def to_dict(self) -> dict:
        return asdict(self)
