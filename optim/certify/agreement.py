"""Agreement among people, and the panel's agreement with each person measured the same way, with 95% bootstrap CIs
over items (``chateval_dspy.run.metrics.bootstrap``: percentile, paired, items resampled). How to read: docs/selective.md.

The level of measurement decides the weights: ``nominal`` (unweighted), ``ordinal`` (linear), ``interval``
(quadratic). Cohen's kappa is per pair of people on the items both labelled; Krippendorff's alpha uses every item
with two labels or more. Fleiss' kappa is nominal by definition and needs the same number of raters per item, so it
uses the items labelled by the most common number of people. A panel's abstention is a class of its own in nominal
figures (so it always disagrees); with a rating scale the abstained items are left out. A figure with no defined
value (one class only, fewer than two items) is NaN and reads ``n/a``.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from chateval_dspy.errors import ConfigError
from chateval_dspy.run.metrics import ABSTAIN, Estimate, bootstrap
from optim.certify.people import People

LEVELS = ("nominal", "ordinal", "interval")
KAPPA_WEIGHTS = {"nominal": None, "ordinal": "linear", "interval": "quadratic"}


def level_for(people: People) -> str:
    """The level a label set is measured at by default: ``ordinal`` when every label is a number, else nominal.

    Example:
        >>> level_for(People({"a": {"x": "1", "y": "tie"}}, "f")), level_for(People({"a": {"x": "1", "y": "3"}}, "f"))
        ('nominal', 'ordinal')
    """
    return "ordinal" if people.numeric() else "nominal"


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise ConfigError(f"unknown level {level!r}; choose one of: {', '.join(LEVELS)}")
    return level


def _values(labels, level: str) -> list:
    return [str(v) for v in labels] if level == "nominal" else [float(v) for v in labels]


def cohen(a, b, level: str = "nominal") -> float:
    """Cohen's kappa of two label lists, weighted by ``level`` as scikit-learn's ``cohen_kappa_score`` weighs (by the
    distance between the ranks of the labels both lists use); NaN when undefined. Numpy, not scikit-learn: the
    bootstrap calls it thousands of times and scikit-learn's checks cost more than the figure.

    Example (by hand: p_o = 0.8, p_e = 0.48):
        >>> round(cohen(["y", "y", "n", "n", "y"] * 2, ["y", "y", "n", "n", "n"] * 2), 3)
        0.615
    """
    weights = KAPPA_WEIGHTS[check_level(level)]
    if len(a) < 2:
        return math.nan
    a, b = _values(a, level), _values(b, level)
    index = {c: i for i, c in enumerate(sorted(set(a) | set(b)))}
    k = len(index)
    observed = np.zeros((k, k))
    np.add.at(observed, ([index[x] for x in a], [index[y] for y in b]), 1)
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / len(a)
    ranks = np.arange(k)
    distance = np.abs(ranks[:, None] - ranks[None, :]).astype(float)
    w = {None: (distance > 0).astype(float), "linear": distance, "quadratic": distance ** 2}[weights]
    chance = float((w * expected).sum())
    return math.nan if chance == 0 else 1 - float((w * observed).sum()) / chance


def fleiss(units) -> float:
    """Fleiss' kappa over the items (lists of labels) that carry the most common number of labels (at least 2).

    Example (Wikipedia's worked example: 10 items, 14 raters, 5 categories, kappa 0.210):
        >>> table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        ...          [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
        >>> units = [[c for c, k in enumerate(row) for _ in range(k)] for row in table]
        >>> round(fleiss(units), 3)
        0.21
    """
    units = fleiss_units(units)
    if len(units) < 2:
        return math.nan
    m = len(units[0])
    counts = [Counter(map(str, u)) for u in units]
    categories = sorted({c for cnt in counts for c in cnt})
    table = np.array([[cnt.get(c, 0) for c in categories] for cnt in counts], dtype=float)
    p_j = table.sum(axis=0) / (len(units) * m)
    p_i = ((table ** 2).sum(axis=1) - m) / (m * (m - 1))
    expected = float((p_j ** 2).sum())
    if expected >= 1.0:
        return math.nan  # every label the same: no chance agreement to correct for
    return (float(p_i.mean()) - expected) / (1 - expected)


def fleiss_units(units) -> list[list]:
    """The items Fleiss' kappa is computed on: those with the most common number of labels (ties: the larger)."""
    sizes = Counter(len(u) for u in units if len(u) >= 2)
    if not sizes:
        return []
    m = max(sizes, key=lambda k: (sizes[k], k))
    return [list(u) for u in units if len(u) == m]


def alpha(units, level: str = "nominal") -> float:
    """Krippendorff's alpha of ``units`` (each item's labels; items with fewer than two are left out) at ``level``.

    Example (Krippendorff 2011's example: 4 coders, 12 items, some labels missing):
        >>> data = [[1, 1, 1], [2, 2, 3, 2], [3, 3, 3, 3], [3, 3, 3, 3], [2, 2, 2, 2], [1, 2, 3, 4], [4, 4, 4, 4],
        ...         [1, 1, 2, 1], [2, 2, 2, 2], [5, 5, 5], [1, 1], [3]]
        >>> [round(alpha(data, level), 3) for level in ("nominal", "ordinal", "interval")]
        [0.743, 0.815, 0.849]
    """
    import krippendorff

    pairable = [_values(u, check_level(level)) for u in units if len(u) >= 2]
    domain = sorted({v for u in pairable for v in u})
    if len(pairable) < 2 or len(domain) < 2:
        return math.nan
    counts = np.array([[c[v] for v in domain] for c in map(Counter, pairable)], dtype=float)
    value_domain = np.arange(len(domain)) if level == "nominal" else np.array(domain, dtype=float)
    return float(krippendorff.alpha(value_counts=counts, value_domain=value_domain, level_of_measurement=level))


def _over_items(statistic, data: list, *, seed: int, n_resamples: int | None) -> Estimate:
    """``statistic(data)`` with its 95% bootstrap CI over items, resampled by index so that an item may be any
    object (a dict, a list) that numpy would otherwise turn into an array's axis."""
    return bootstrap(lambda idx: statistic([data[i] for i in idx]), list(range(len(data))), seed=seed,
                     n_resamples=n_resamples)


@dataclass(frozen=True)
class Figure:
    """One agreement figure: what it measures and its estimate."""

    name: str
    estimate: Estimate


def _pair_kappa(p: str, q: str, level: str):
    def statistic(units) -> float:
        both = [u for u in units if p in u and q in u]
        return cohen([u[p] for u in both], [u[q] for u in both], level)
    return statistic


def people_agreement(people: People, level: str | None = None, *, seed: int = 0,
                     n_resamples: int | None = None) -> list[Figure]:
    """Agreement among the people: Cohen's kappa per pair, Fleiss' kappa, Krippendorff's alpha (module's rules).

    Example:
        >>> p = People({str(i): {"a": str(i % 3), "b": str(i % 3), "c": str(i % 2)} for i in range(30)}, "f")
        >>> [f.name for f in people_agreement(p, "nominal", n_resamples=50)]
        ["Cohen's kappa a ~ b", "Cohen's kappa a ~ c", "Cohen's kappa b ~ c", "Fleiss' kappa", "Krippendorff's alpha (nominal)"]
    """
    level = check_level(level or level_for(people))
    units = list(people.labels.values())
    ci = {"seed": seed, "n_resamples": n_resamples}
    out = []
    for p, q in combinations(people.annotators(), 2):
        both = [u for u in units if p in u and q in u]
        out.append(Figure(f"Cohen's kappa {p} ~ {q}", _over_items(_pair_kappa(p, q, level), both, **ci)))
    lists = [list(u.values()) for u in units]
    out.append(Figure("Fleiss' kappa", _over_items(fleiss, fleiss_units(lists), **ci)))
    pairable = [u for u in lists if len(u) >= 2]
    out.append(Figure(f"Krippendorff's alpha ({level})", _over_items(lambda us: alpha(us, level), pairable, **ci)))
    return out


@dataclass(frozen=True)
class PanelBeside:
    """One person's row: the other people's mean kappa with that person, beside the panel's kappa with them."""

    person: str
    people: Estimate
    panel: Estimate


def _others_kappa(person: str, level: str):
    def statistic(pairs) -> float:
        units = [u for u, _ in pairs]
        others = sorted({q for u in units for q in u if q != person})
        return float(np.nanmean([_pair_kappa(person, q, level)(units) for q in others] or [math.nan]))
    return statistic


def _panel_kappa(person: str, level: str):
    def statistic(pairs) -> float:
        kept = [(u[person], j) for u, j in pairs if j is not None]
        return cohen([h for h, _ in kept], [j for _, j in kept], level)
    return statistic


def panel_beside_people(people: People, judged: dict[str, str | None], level: str | None = None, *, seed: int = 0,
                        n_resamples: int | None = None) -> list[PanelBeside]:
    """For each person, the other people's mean Cohen's kappa with them beside the panel's (module's rules).
    ``judged``: the panel's label per item id (canonical text; None: it abstained); every labelled item is judged.
    """
    level = check_level(level or level_for(people))
    rows, ci = [], {"seed": seed, "n_resamples": n_resamples}
    for person in people.annotators():
        ids = [i for i, by in people.labels.items() if person in by and len(by) >= 2]
        # A nominal abstention is a class of its own; on a rating scale it has no value and is left out.
        pairs = [(people.labels[i], ABSTAIN if judged[i] is None and level == "nominal" else judged[i]) for i in ids]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nanmean of a resample where no pair is defined
            rows.append(PanelBeside(person, _over_items(_others_kappa(person, level), pairs, **ci),
                                    _over_items(_panel_kappa(person, level), pairs, **ci)))
    return rows
