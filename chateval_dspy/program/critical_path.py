"""How long a verdict must take: its LM calls and the longest chain of them that wait on each other.

A call waits on another when it is shown that call's output. Under ``one_by_one`` every turn sees the
turn before it, so a whole debate is one chain; under the simultaneous strategies only rounds wait on
rounds (and on the summary between them). The two answer orders of a calibrated verdict never see each
other, so ``ChatEval`` runs them at once and the chain is one order's. With a per-call latency ``L``,
``chain x L`` is the floor of a verdict's wall time however many calls run in parallel.
"""

from __future__ import annotations

from chateval_dspy.config import DebateConfig
from chateval_dspy.program.strategies import STRATEGIES


def critical_path(config: DebateConfig, *, parallel_orders: bool = True) -> dict:
    """LM calls per verdict and the longest chain of dependent calls, for a panel's shape.

    Parse retries are not counted. With ``consensus_stop`` a debate may end early, so both figures are upper bounds
    (``upper_bound``). ``parallel_orders`` False: the chain runs through both orders, one after the other.

    Example:
        >>> cfg = DebateConfig(roles=("general_public", "critic"), turns=2)  # one_by_one, both orders
        >>> path = critical_path(cfg)
        >>> path["calls"], path["chain"], critical_path(cfg, parallel_orders=False)["chain"]
        (8, 4, 8)
        >>> critical_path(cfg.replace(strategy="simultaneous_talk"))["chain"]
        2
        >>> path = critical_path(cfg.replace(strategy="simultaneous_talk_with_summarizer", turns=3))
        >>> path["calls"], path["chain"]
        (16, 5)
    """
    strategy = STRATEGIES[config.strategy]
    referees, rounds = len(config.roles), config.turns
    summaries = rounds - 1 if strategy.summarize else 0
    per_order_calls = referees * rounds + summaries
    # A concurrent round costs the chain one call however many referees speak in it.
    per_order_chain = (rounds if strategy.concurrent_rounds else referees * rounds) + summaries
    orders = config.orders
    return {
        "calls": orders * per_order_calls,
        "chain": per_order_chain * (1 if parallel_orders else orders),
        "orders": orders,
        "per_order": {"calls": per_order_calls, "chain": per_order_chain},
        "parallel_orders": parallel_orders and orders > 1,
        "upper_bound": config.consensus_stop,
    }
