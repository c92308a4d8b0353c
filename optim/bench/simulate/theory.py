"""What the simulated referees' model predicts, exactly: the panel verdict's distribution by dynamic programming.

The model is the one in ``chateval_dspy.testing.sim_lm``. Every final tally's probability is computed speaker by
speaker through the strategy's visibility rule, so herding, position bias, aggregation and answer-order calibration
are exact, with no sampling; with independent referees the majority curve is Condorcet's binomial sum.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from chateval_dspy.testing.sim_lm import SimKnobs

View = tuple[int, int, str | None]  # leanings seen: how many for answer 1, for answer 2, and the latest
EMPTY: View = (0, 0, None)


def prevailing(view: View) -> str | None:
    """The herd's target in a view: the answer stated most often, on a tie the latest (as ``sim_lm.prevailing``)."""
    c1, c2, last = view
    return "1" if c1 > c2 else "2" if c2 > c1 else last


def _add(view: View, answer: str) -> View:
    return view[0] + (answer == "1"), view[1] + (answer == "2"), answer


def _merge(first: View, then: View) -> View:
    return first[0] + then[0], first[1] + then[1], then[2] or first[2]


def _turn(p: float, label: str, view: View, k: SimKnobs) -> list[tuple[str, int, float]]:
    """One speaker's ``(answer, score margin, probability)`` given what it sees."""
    other = "2" if label == "1" else "1"
    out, rest = [], 1.0
    target = prevailing(view)
    if target is not None and k.herding:
        out.append((target, k.margin_wrong, k.herding))
        rest = 1.0 - k.herding
    out += [("1", k.margin_wrong, rest * k.position_bias), (label, k.margin_right, rest * (1 - k.position_bias) * p),
            (other, k.margin_wrong, rest * (1 - k.position_bias) * (1 - p))]
    return [o for o in out if o[2] > 0]


def tallies(ps: Sequence[float], label: str, k: SimKnobs, *, strategy: str, turns: int) -> dict[tuple, float]:
    """Distribution of the final round's tally ``(votes for 1, votes for 2, sum of signed score margins)``.

    ``ps``: each referee's accuracy, in speaking order (``k`` gives the rest of the model); ``label``: the better
    answer's position in this order; the last of ``turns`` rounds is the verdict, earlier ones are talk.

    Example:
        >>> round(sum(v for (a, b, _), v in tallies([0.7] * 3, "1", SimKnobs(), strategy="one_by_one",
        ...                                              turns=1).items() if a > b), 3)
        0.784
    """
    # state: (view shown to speakers, this round's leanings, summaries' leanings, final tally)
    states: dict[tuple, float] = {(EMPTY, EMPTY, EMPTY, (0, 0, 0)): 1.0}
    for rnd in range(1, turns + 1):
        final = rnd == turns
        for p in ps:
            nxt: dict[tuple, float] = defaultdict(float)
            for (view, cur, summaries, tally), w in states.items():
                for answer, margin, q in _turn(p, label, view, k):
                    seen = _add(view, answer) if strategy == "one_by_one" else view
                    t = tally
                    if final:
                        t = (tally[0] + (answer == "1"), tally[1] + (answer == "2"),
                             tally[2] + (margin if answer == "1" else -margin))
                    nxt[(seen, _add(cur, answer), summaries, t)] += w * q
            states = nxt
        if final:
            break
        nxt = defaultdict(float)
        for (view, cur, summaries, tally), w in states.items():
            if strategy == "simultaneous_talk":
                view = _merge(view, cur)
            elif strategy == "simultaneous_talk_with_summarizer":
                said = prevailing(_merge(summaries, cur))
                summaries = _add(summaries, said)
                view = _add(EMPTY, said)
            nxt[(view, EMPTY, summaries, tally)] += w
        states = nxt
    out: dict[tuple, float] = defaultdict(float)
    for (_, _, _, tally), w in states.items():
        out[tally] += w
    return dict(out)


def verdict(tally: tuple, aggregate: str) -> str:
    """The panel's verdict from a tally, as ``chateval_dspy.program.aggregate`` reaches it."""
    v1, v2, diff = tally
    a, b = (v1, v2) if aggregate == "majority" else (diff, 0)
    return "1" if a > b else "2" if b > a else "tie"


def panel(ps: Sequence[float], k: SimKnobs, *, strategy: str = "simultaneous_talk", turns: int = 1,
          aggregate: str = "majority", calibrate: bool = False, labels: Sequence[str] = ("1", "2")) -> dict:
    """Expected accuracy (and, calibrated, consistency of the two orders) of a panel, averaged over ``labels``.

    Example:
        >>> round(panel([0.7], SimKnobs(position_bias=0.2), calibrate=False)["accuracy"], 3)
        0.66
    """
    acc = cons = 0.0
    for label in labels:
        first = tallies(ps, label, k, strategy=strategy, turns=turns)
        if not calibrate:
            acc += sum(w for t, w in first.items() if verdict(t, aggregate) == label)
            continue
        # The swapped order shows the better answer in the other place; its votes are mapped back.
        swapped = tallies(ps, "2" if label == "1" else "1", k, strategy=strategy, turns=turns)
        back = {"1": "2", "2": "1", "tie": "tie"}
        for (a1, a2, ad), wa in first.items():
            for (b1, b2, bd), wb in swapped.items():
                pooled = (a1 + b2, a2 + b1, ad - bd)
                acc += wa * wb * (verdict(pooled, aggregate) == label)
                cons += wa * wb * (verdict((a1, a2, ad), aggregate) == back[verdict((b1, b2, bd), aggregate)])
    n = len(labels)
    return {"accuracy": acc / n, "consistency": cons / n if calibrate else None}


def condorcet(p: float, n: int) -> float:
    """P(a strict majority of ``n`` independent referees of accuracy ``p`` is right); a split counts as wrong.

    Example:
        >>> round(condorcet(0.6, 3), 3)
        0.648
    """
    return sum(math.comb(n, c) * p ** c * (1 - p) ** (n - c) for c in range(n // 2 + 1, n + 1))
