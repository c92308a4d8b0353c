"""What a search trial may choose (referees, turns, strategy, aggregation, how to compile), and ``trial.suggest_*``
-> ``DebateConfig``. The bounds come from ``chateval_dspy.limits``: a space never draws a panel ``DebateConfig``
would refuse.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from chateval_dspy import limits
from chateval_dspy.config import AGGREGATES, DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.roles import DEFAULT_ORDER, same_roles
from chateval_dspy.program.strategies import STRATEGIES

if TYPE_CHECKING:  # Optuna is imported by whoever runs trials: the parser and SearchSpace do without it
    import optuna

# cascade_cost: US dollars per 1,000 verdicts of the cascade [--first-stage -> the trial's panel] (optim.tuning.cascade).
# robustness: the bias audit's mean robustness rate over its text probes on the dev items (optim.audit).
OBJECTIVES = {"agreement": "maximize", "tokens": "minimize", "cascade_cost": "minimize", "robustness": "maximize"}
OBJECTIVE_SETS = (("agreement",), ("agreement", "tokens"), ("agreement", "cascade_cost"), ("agreement", "robustness"),
                  ("agreement", "tokens", "robustness"), ("agreement", "cascade_cost", "robustness"))
COMPILE_CHOICES = ("none", "labeled", "bootstrap")
PANELS = ("distinct", "same")


@dataclass(frozen=True)
class SearchSpace:
    """What a trial may choose; a dimension with a single value is fixed. ``panels``: ``distinct`` (a subset of the
    built-in personas, so at most five) and/or ``same`` (the same-role ablation, up to ``limits.MAX_ROLES``);
    ``n_roles`` and ``turns`` (1-4 is the paper's range) are ``(fewest, most)``.

    Example:
        >>> SearchSpace(turns=(2, 2)).to_dict()["turns"]
        [2, 2]
    """

    panels: tuple[str, ...] = PANELS
    n_roles: tuple[int, int] = (1, len(DEFAULT_ORDER))
    turns: tuple[int, int] = (1, 4)
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    aggregates: tuple[str, ...] = AGGREGATES
    compile: tuple[str, ...] = ("none",)

    def __post_init__(self) -> None:
        for name, allowed in (("panels", PANELS), ("strategies", tuple(STRATEGIES)), ("aggregates", AGGREGATES),
                              ("compile", COMPILE_CHOICES)):
            values = tuple(getattr(self, name))
            if not values:
                raise ConfigError(f"the search space needs at least one of {name}: {', '.join(allowed)}")
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise ConfigError(f"unknown {name} {unknown}; choose from: {', '.join(allowed)}")
            object.__setattr__(self, name, tuple(dict.fromkeys(values)))
        low, high = self.n_roles
        most = len(DEFAULT_ORDER) if "distinct" in self.panels else limits.MAX_ROLES
        if not 1 <= low <= high <= most:
            what = "the built-in personas" if "distinct" in self.panels else "limits.MAX_ROLES"
            raise ConfigError(f"panel size must lie in 1..{most} ({what}), got {low}..{high}")
        low, high = self.turns
        if not 1 <= low <= high <= limits.MAX_TURNS:
            raise ConfigError(f"turns must be a range within 1..{limits.MAX_TURNS} (limits.MAX_TURNS), got {low}..{high}")
        object.__setattr__(self, "n_roles", tuple(self.n_roles))
        object.__setattr__(self, "turns", tuple(self.turns))

    def to_dict(self) -> dict:
        return {k: list(v) for k, v in asdict(self).items()}


def persona_sets(n: int) -> list[str]:
    """Every set of ``n`` built-in personas, in the paper's speaking order, as ``a+b`` strings.

    Example:
        >>> persona_sets(4)[0]
        'general_public+critic+news_author+psychologist'
    """
    return ["+".join(c) for c in itertools.combinations(DEFAULT_ORDER, n)]


def suggest_config(trial: optuna.Trial, space: SearchSpace, base: DebateConfig) -> tuple[DebateConfig, str]:
    """The trial's panel as a ``DebateConfig`` (everything not searched comes from ``base``) and its compile choice.
    Persona sets are one categorical per panel size (``personas_<n>``), so ``n_roles`` stays a parameter of its own
    (the paper's Figure 3 axis).

    Example:
        >>> import optuna
        >>> trial = optuna.trial.FixedTrial({"panel": "same", "n_roles": 3, "turns": 2, "strategy": "one_by_one",
        ...                                  "aggregate": "mean", "compile": "none"})
        >>> suggest_config(trial, SearchSpace(), DebateConfig())[0].roles
        ('referee_1', 'referee_2', 'referee_3')
    """
    panel = trial.suggest_categorical("panel", space.panels)
    n = trial.suggest_int("n_roles", *space.n_roles)
    if panel == "same":
        roles = same_roles(n)
    else:
        choices = persona_sets(n)  # a panel of all five has nothing to choose
        roles = tuple((trial.suggest_categorical(f"personas_{n}", choices) if len(choices) > 1 else choices[0]).split("+"))
    turns = trial.suggest_int("turns", *space.turns)
    strategy = trial.suggest_categorical("strategy", space.strategies)
    aggregate = trial.suggest_categorical("aggregate", space.aggregates)
    compile_choice = trial.suggest_categorical("compile", space.compile)
    return base.replace(roles=roles, turns=turns, strategy=strategy, aggregate=aggregate), compile_choice


def parse_objectives(text: str | Sequence[str]) -> tuple[str, ...]:
    """``agreement``, then ``tokens`` or ``cascade_cost`` or neither, then ``robustness`` or not (``OBJECTIVE_SETS``):
    agreement always comes first (it picks the final program).

    Example:
        >>> parse_objectives("agreement, cascade_cost"), parse_objectives("agreement,robustness")
        (('agreement', 'cascade_cost'), ('agreement', 'robustness'))
    """
    names = tuple(p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip())
    if names not in OBJECTIVE_SETS:
        raise ConfigError(f"--objectives must be one of {', '.join(repr(','.join(o)) for o in OBJECTIVE_SETS)}, "
                          f"got {text!r}")
    return names
