"""People against people, and the panel against them: a results file of the panel joined by item id with several
people's labels, read into the figures ``chateval certify`` prints.

The results file is one a run of ``chateval evaluate`` or ``chateval score`` wrote (JSON Lines, one line per item,
read through ``read_rows``: bounded, never modified). A line's ``prediction`` (score's lines: ``winner``, or
``scores`` for a scoring task) is the panel's label: a preference (``1``, ``2``, ``tie``), or, for a scoring task, an
object of scores of which ``criterion`` is taken; ``null`` and error lines are abstentions. The item ids of both
sides must match exactly: an id on one side only is refused, with how many there are on each side and a few of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from chateval_dspy.data.rows import read_rows
from chateval_dspy.errors import DataError, shown
from chateval_dspy.run.records import is_error
from optim.certify.agreement import Figure, PanelBeside, check_level, level_for, panel_beside_people, people_agreement
from optim.certify.alt_test import DEFAULT_KIND, AltTest, alt_test
from optim.certify.people import People, canonical, is_number
from optim.tuning.labels import check_name

SHOWN_IDS = 5  # ids named in a mismatch error


def _verdict(record: dict, criterion: str | None, source: str, row: int) -> str | None:
    if is_error(record):
        return None
    # evaluate's lines hold a prediction; score's a winner (pairwise) or scores
    fields = ("prediction", "winner", "scores") if record.get("format") == "pairwise" else ("prediction", "scores")
    field = next((f for f in fields if f in record), None)
    if field is None:
        raise DataError("a results line needs a prediction (chateval evaluate) or a winner / scores (chateval "
                        "score), null for an abstention", source=source, row=row, field="prediction")
    value = record[field]
    if isinstance(value, dict):
        if criterion is None or criterion not in value:
            raise DataError(f"the prediction holds scores {sorted(map(str, value))[:10]}: name one with the criterion "
                            f"(--criterion){'' if criterion is None else f'; {criterion!r} is not there'}",
                            source=source, row=row, field="prediction")
        value = value[criterion]
    return canonical(value, source=source, row=row, field="prediction")


def read_verdicts(path: str, *, criterion: str | None = None) -> dict[str, str | None]:
    """The panel's label per item id from a results file (None: it abstained or the line is an error line)."""
    out: dict[str, str | None] = {}
    for row, record in read_rows(path):
        if record.get("id") in (None, ""):
            raise DataError("a results line needs the item's id", source=str(path), row=row, field="id")
        item = check_name(record["id"], source=str(path), row=row, field="id")
        if item in out:
            raise DataError(f"item {shown(item, 60)} has two results lines", source=str(path), row=row, field="id")
        out[item] = _verdict(record, criterion, str(path), row)
    return out


def check_join(verdicts: dict, people: People, results: str, *, judged_only: bool = False) -> People:
    """Refuse item ids that do not match between the results and the people's labels, saying how many; with
    ``judged_only``, labelled items without a results line are left out instead (of the people returned)."""
    if judged_only:
        people = People({i: by for i, by in people.labels.items() if i in verdicts}, people.source)
    unjudged = sorted(set(people.labels) - set(verdicts))
    unlabelled = sorted(set(verdicts) - set(people.labels))
    if not unjudged and not unlabelled:
        return people
    parts = [f"{len(ids)} {what} (e.g. {ids[:SHOWN_IDS]})" for ids, what in (
        (unlabelled, "judged item(s) no person labelled"), (unjudged, "labelled item(s) with no results line")) if ids]
    raise DataError(f"item ids do not match {people.source} ({len(people.labels)} labelled, {len(verdicts)} judged): "
                    + "; ".join(parts) + ". Run the panel on exactly the labelled items (or certify only the judged ones)",
                    source=results)


@dataclass(frozen=True)
class Certificate:
    """People against people and the panel beside them: the figures, what they rest on, and ``lines()`` to print."""

    results: str | None  # None: the people only
    people: People
    level: str
    among: list[Figure]
    beside: list[PanelBeside]
    test: AltTest | None
    abstained: int

    def lines(self) -> list[str]:
        counts = ", ".join(f"{who} {n}" for who, n in self.people.counts().items())
        out = [f"people: {self.people.source}, {len(self.people.labels)} items, {len(counts.split(', '))} people "
               f"(items each: {counts}); level {self.level}; 95% bootstrap CIs over items",
               "agreement among the people:"]
        out += [f"  {f.name:<40} {f.estimate}  n={f.estimate.n}" for f in self.among]
        if self.test is None:
            return out
        out += [f"panel ({self.results}, {self.abstained} abstained) beside each person, Cohen's kappa with that person:",
                f"  {'person':<20} {'other people (mean)':<34} panel"]
        out += [f"  {r.person:<20} {str(r.people) + f'  n={r.people.n}':<34} {r.panel}  n={r.panel.n}"
                for r in self.beside]
        return out + ["alternative annotator test: " + self.test.line()]


def certify(results: str | None, people: People, *, criterion: str | None = None, level: str | None = None,
            epsilon: float | None = None, kind: str = DEFAULT_KIND, judged_only: bool = False, seed: int = 0,
            n_resamples: int | None = None) -> Certificate:
    """The panel of ``results`` against ``people``: agreement among them, the panel beside each, the alternative
    annotator test (``accuracy`` scoring for categories, ``neg_rmse`` for rating scales). ``results=None``: the
    agreement among the people only. ``judged_only``: the people's items without a results line are left out (the
    header says how many people's items remain), else they are refused."""
    level = check_level(level or level_for(people))
    if level != "nominal" and not people.numeric():
        raise DataError(f"level {level} needs numbers; some people's labels are not", source=people.source)
    ci = {"seed": seed, "n_resamples": n_resamples}
    if results is None:
        return Certificate(None, people, level, people_agreement(people, level, **ci), [], None, 0)
    verdicts = read_verdicts(results, criterion=criterion)
    people = check_join(verdicts, people, results, judged_only=judged_only)
    return certify_judged(verdicts, people, results=results, level=level, epsilon=epsilon, kind=kind, **ci)


def certify_judged(verdicts: dict[str, str | None], people: People, *, results: str, level: str | None = None,
                   epsilon: float | None = None, kind: str = DEFAULT_KIND, seed: int = 0,
                   n_resamples: int | None = None) -> Certificate:
    """``certify`` of the panel's ``verdicts`` (item id -> label, None: abstained; read from ``results``, which the
    certificate names) on exactly the items ``people`` labelled.

    Example:
        >>> labels = {str(i): {"a": "1", "b": "1", "c": "2" if i % 2 else "1"} for i in range(40)}
        >>> cert = certify_judged({str(i): "1" for i in range(40)}, People(labels, "people.csv"), results="r.jsonl",
        ...                       level="nominal", n_resamples=50)
        >>> cert.test.replaces, cert.abstained
        (True, 0)
    """
    level = check_level(level or level_for(people))
    bad = sorted(i for i, v in verdicts.items() if level != "nominal" and v is not None and not is_number(v))
    if bad:
        raise DataError(f"level {level} needs numbers; the panel's label of item(s) {bad[:SHOWN_IDS]} is not one",
                        source=results)
    ci = {"seed": seed, "n_resamples": n_resamples}
    test = alt_test(verdicts, people.labels, scoring="accuracy" if level == "nominal" else "neg_rmse",
                    epsilon=epsilon, kind=kind, **ci)
    return Certificate(results, people, level, people_agreement(people, level, **ci),
                       panel_beside_people(people, verdicts, level, **ci), test,
                       sum(v is None for v in verdicts.values()))
