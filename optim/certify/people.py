"""Several people's labels per item, from a file or from the review page, as ``People``.

Ways in (docs/selective.md): per-annotator columns, a long file (one row per item and person; one person answering
one item twice is refused as ambiguous), the review page's reviewers (read by ``optim.tuning.labels``' rule), and the
USR release (``tc_usr_data.json``, not shipped: its release names no licence; item ids count the responses in file
order from 0, the ids of the shipped ``topical_chat_usr.jsonl``).

Everything read is untrusted: bounded by ``read_rows``, names and labels checked (``check_name``, ``check_label``),
at most ``MAX_ANNOTATORS`` people; errors name the file and row. Labels are kept as canonical text: a number as
``format(float(x), "g")`` (so ``1``, ``1.0`` and ``"1"`` are the same label), any other text stripped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chateval_dspy.data.rows import read_rows
from chateval_dspy.errors import DataError, shown
from optim.tuning.labels import PREFIX, check_label, check_name

MAX_ANNOTATORS = 100  # a label study's panel of people; MLflow's review queues allow 10 reviewers
LONG_COLUMNS = ("id", "annotator", "label")


@dataclass(frozen=True)
class People:
    """People's labels: ``labels[item id][annotator] = label`` (canonical text), and where they came from.

    Example:
        >>> p = People({"q1": {"ann": "1", "bo": "2"}, "q2": {"ann": "tie"}}, "labels.csv")
        >>> p.annotators(), p.numeric()
        (['ann', 'bo'], False)
    """

    labels: dict[str, dict[str, str]]
    source: str

    def annotators(self) -> list[str]:
        """Everyone who labelled at least one item, sorted."""
        return sorted({who for by in self.labels.values() for who in by})

    def numeric(self) -> bool:
        """Whether every label is a number (a rating scale) rather than a category."""
        return all(is_number(v) for by in self.labels.values() for v in by.values())

    def counts(self) -> dict[str, int]:
        """Items labelled per person."""
        return {who: sum(who in by for by in self.labels.values()) for who in self.annotators()}


def is_number(value: str) -> bool:
    """Whether a canonical label is a finite number."""
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def canonical(value, *, source: str, row: int | None, field: str) -> str | None:
    """One label as canonical text, or None for no label (an empty cell, null).

    Example:
        >>> canonical(1, source="f", row=2, field="a1"), canonical(" 1.0 ", source="f", row=2, field="a1")
        ('1', '1')
        >>> canonical("tie", source="f", row=2, field="a1"), canonical("", source="f", row=2, field="a1")
        ('tie', None)
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise DataError("a label is a number or a text, not true/false", source=source, row=row, field=field)
    check_label(value, source=source, row=row, field=field)
    text = str(value).strip()
    if is_number(text):
        return format(float(text), "g")
    if isinstance(value, float):  # nan, inf
        raise DataError(f"{value!r} is no label", source=source, row=row, field=field)
    return text


def _put(labels: dict, item: str, who: str, raw, *, source: str, row: int | None, field: str) -> None:
    """Add ``who``'s label of ``item`` (``raw``, made canonical; no label adds nothing)."""
    value = canonical(raw, source=source, row=row, field=field)
    if value is None:
        return
    by = labels.setdefault(item, {})
    if who in by:
        raise DataError(f"{shown(who, 60)} labelled item {shown(item, 60)} twice; keep one answer per person and item",
                        source=source, row=row)
    by[who] = value


def _name(record: dict, column: str, source: str, row: int, what: str = "an item id") -> str:
    if record.get(column) in (None, ""):
        raise DataError(f"a row needs {what}", source=source, row=row, field=column)
    return check_name(record[column], source=source, row=row, field=column)


def _checked(labels: dict, source: str) -> People:
    people = People({k: v for k, v in labels.items() if v}, source)
    if not people.labels:
        raise DataError("no labels found", source=source)
    if len(people.annotators()) > MAX_ANNOTATORS:
        raise DataError(f"{len(people.annotators())} annotators; the limit is {MAX_ANNOTATORS} "
                        "(optim.certify.people.MAX_ANNOTATORS)", source=source)
    return people


def from_columns(path: str, annotators, *, id_column: str = "id") -> People:
    """People's labels from per-annotator columns of a JSONL/CSV file (see the module's rules)."""
    source = str(path)
    annotators = [check_name(a, source="annotators", row=None, field="annotators") for a in annotators]
    if len(set(annotators)) != len(annotators) or not annotators:
        raise DataError(f"annotator columns must be distinct and at least one, got {annotators}", source=source)
    if len(annotators) > MAX_ANNOTATORS:
        raise DataError(f"{len(annotators)} annotator columns; the limit is {MAX_ANNOTATORS}", source=source)
    rows = read_rows(path)
    absent = [a for a in annotators if not any(a in r for _, r in rows)]
    if absent:
        raise DataError(f"no row has the annotator column(s) {absent}", source=source)
    labels: dict[str, dict[str, str]] = {}
    for row, record in rows:
        item = _name(record, id_column, source, row)
        if item in labels:
            raise DataError(f"item {shown(item, 60)} appears twice; one row per item in this format",
                            source=source, row=row, field=id_column)
        labels[item] = {}
        for who in annotators:
            _put(labels, item, who, record.get(who), source=source, row=row, field=who)
    return _checked(labels, source)


def from_long(path: str, *, columns: tuple[str, str, str] = LONG_COLUMNS) -> People:
    """People's labels from a long JSONL/CSV file (``columns``: item id, annotator, label)."""
    id_column, who_column, label_column = columns
    source, labels = str(path), {}
    for row, record in read_rows(path):
        item = _name(record, id_column, source, row)
        who = _name(record, who_column, source, row, "the annotator who gave the label")
        _put(labels, item, who, record.get(label_column), source=source, row=row, field=label_column)
    return _checked(labels, source)


def from_traces(traces, *, question: str = "label", source: str = "traces") -> People:
    """People's labels from traced debates' human feedback to ``question`` (each reviewer's latest answer)."""
    from chateval_dspy.deploy.mlflow.trace_labels import human_answers, item_id_of

    labels: dict[str, dict[str, str]] = {}
    for row, trace in enumerate(traces, 1):
        where = f"{source} trace {shown(trace.info.trace_id, 80)}"
        item = check_name(item_id_of(trace), source=where, row=row, field="id")
        for who, raw in human_answers(trace).get(question, {}).items():
            who = check_name(who, source=where, row=row, field="reviewer")
            _put(labels, item, who, raw, source=where, row=row, field=question)
    return _checked(labels, source)


def from_usr(path: str, aspect: str) -> People:
    """People's ratings of one ``aspect`` (``Natural``, ``Maintains Context``, ``Engaging``, ``Uses Knowledge``,
    ``Understandable``, ``Overall``) from the USR release: a JSON array of dialogue contexts, each with its
    ``annotators`` and ``responses`` holding one list of ratings per aspect, in the annotators' order.

    Example:
        >>> from_usr("tc_usr_data.json", "Overall").counts()  # doctest: +SKIP
        {'er': 180, 'fl': 180, 'me': 180, 'sm': 360, 'yf': 180}
    """
    source, labels = str(path), {}
    for row, context in read_rows(path):
        who = context.get("annotators")
        if not isinstance(who, list) or not isinstance(context.get("responses"), list):
            raise DataError("a USR context needs lists 'annotators' and 'responses'", source=source, row=row)
        who = [check_name(w, source=source, row=row, field="annotators") for w in who]
        for response in context["responses"]:
            ratings = response.get(aspect) if isinstance(response, dict) else None
            if not isinstance(ratings, list) or len(ratings) != len(who):
                raise DataError(f"a response needs {len(who)} ratings of {aspect!r}, one per annotator",
                                source=source, row=row, field=aspect)
            item = str(len(labels))
            labels[item] = {}
            for person, value in zip(who, ratings):
                _put(labels, item, person, value, source=source, row=row, field=aspect)
    return _checked(labels, source)


def read_people(source: str, *, annotators=None, columns: tuple[str, str, str] = LONG_COLUMNS,
                question: str = "label", usr_aspect: str | None = None, tracking_uri: str | None = None) -> People:
    """People's labels from ``source``: ``mlflow:<experiment>[?filter=...]`` (the review page's reviewers), the USR
    release (given ``usr_aspect``), a file with per-annotator columns (given ``annotators``), else a long file
    (``columns``)."""
    if source.startswith(PREFIX):
        from optim.tuning.labels import traces_of

        return from_traces(traces_of(source, tracking_uri=tracking_uri), question=question, source=source)
    if usr_aspect:
        return from_usr(source, usr_aspect)
    if annotators:
        return from_columns(source, annotators, id_column=columns[0])
    return from_long(source, columns=columns)
