"""Simulated people (and a simulated judge) of known quality, for the certificate's tests and benchmark.

Each item has a hidden true label, drawn uniformly from ``classes``, and a difficulty ``d`` drawn uniformly from
``[0, difficulty_spread]``. A rater of accuracy ``a`` (a person, or the judge) gives the true label with probability
``a * (1 - d) / (1 - spread / 2)`` (clipped to [0, 1]), so that its accuracy over items is ``a`` on average while
hard items trip everyone up together; otherwise it gives one of the other labels, uniformly. Everything is drawn
from one ``numpy`` generator seeded by ``seed``, so a draw is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAIRWISE = ("1", "2", "tie")


@dataclass(frozen=True)
class Annotated:
    """One simulated study: the hidden truth, each person's labels and the judge's, by item id."""

    truth: dict[str, str]
    people: dict[str, dict[str, str]]  # {item id: {person: label}}
    judge: dict[str, str]


def _rater(rng: np.random.Generator, truth: list[int], difficulty: np.ndarray, accuracy: float, spread: float,
           k: int) -> list[int]:
    right = np.clip(accuracy * (1 - difficulty) / (1 - spread / 2), 0, 1)
    correct = rng.random(len(truth)) < right
    wrong = (np.asarray(truth) + rng.integers(1, k, len(truth))) % k  # one of the other k - 1 labels
    return [t if c else int(w) for t, c, w in zip(truth, correct, wrong)]


def simulate(n_items: int, people: Sequence[float], judge: float, *, classes: Sequence[str] = PAIRWISE,
             difficulty_spread: float = 0.5, seed: int = 0) -> Annotated:
    """A study of ``n_items`` items labelled by people of accuracies ``people`` and a judge of accuracy ``judge``.

    People are named ``a1``, ``a2``, ...; item ids are ``"0"``, ``"1"``, ...

    Example:
        >>> s = simulate(2000, [0.7, 0.7, 0.7], 0.9, seed=1)
        >>> sorted(s.people["0"]), round(sum(s.judge[i] == t for i, t in s.truth.items()) / 2000, 1)
        (['a1', 'a2', 'a3'], 0.9)
    """
    if not 0 <= difficulty_spread < 1:
        raise ValueError(f"difficulty_spread must be in [0, 1), got {difficulty_spread}")
    rng = np.random.default_rng(seed)
    k = len(classes)
    truth = [int(t) for t in rng.integers(0, k, n_items)]
    difficulty = rng.uniform(0, difficulty_spread, n_items)
    drawn = {f"a{j + 1}": _rater(rng, truth, difficulty, a, difficulty_spread, k) for j, a in enumerate(people)}
    judged = _rater(rng, truth, difficulty, judge, difficulty_spread, k)
    ids = [str(i) for i in range(n_items)]
    return Annotated({i: classes[t] for i, t in zip(ids, truth)},
                     {i: {who: classes[labels[n]] for who, labels in drawn.items()} for n, i in enumerate(ids)},
                     {i: classes[j] for i, j in zip(ids, judged)})
