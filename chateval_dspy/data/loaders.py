"""Datasets with human labels, as ``dspy.Example``s: the built-in FairEval and Topical-Chat, and your own files.

An item holds its task's inputs (``task.TaskSpec``) and its human labels: pairwise, ``label`` in {"1", "2", "tie"}
(or None); pointwise, ``human`` {criterion: number or label, None where missing} (or None). Every problem names
the file, row and field.
"""

from __future__ import annotations

import logging
from pathlib import Path

import dspy

from chateval_dspy.data.rows import read_rows
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.program.task import InputSpec, TaskSpec, as_task

log = logging.getLogger(__name__)

# The built-in datasets are package data beside this module, so an installed wheel carries them.
DATA_DIR = Path(__file__).resolve().parent
BUILTIN = {
    "faireval": ("faireval.jsonl", "pairwise"),
    "topical_chat": ("topical_chat_usr.jsonl", "pointwise"),
}
LABELS = {"1": "1", "2": "2", "tie": "tie", "a": "1", "b": "2", "draw": "tie"}
FAIREVAL_LABELS = {"chatgpt": "1", "vicuna13b": "2", "tie": "tie"}


class Items(list):
    """Loaded items (a list), and the rows skipped as malformed when loading with ``skip_bad_rows``.

    Example:
        >>> Items([1, 2], skipped=[DataError("field is missing", source="a.csv", row=3, field="question")]).skipped[0].row
        3
    """

    def __init__(self, items=(), *, skipped=()):
        super().__init__(items)
        self.skipped: list[DataError] = list(skipped)


def _value(record: dict, column: str):
    """A record's value for ``column``: a key, or a dotted path into nested JSON objects (``human.coherence``)."""
    if column in record:
        return record[column]
    value = record
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _has(record: dict, column: str) -> bool:
    return column in record or ("." in column and _value(record, column) is not None)


def _text(record: dict, inp: InputSpec, column: str, source: str, row: int) -> str:
    """The text of input ``inp`` in ``column``, or its ``default`` where that is missing or blank."""
    value = _value(record, column)
    if value is not None and not isinstance(value, str):
        raise DataError(f"expected text, got {type(value).__name__}", source=source, row=row, field=column)
    # An empty judged response is data (a model that said nothing); an empty question or context is not.
    if value is None or (not value.strip() and not inp.judged):
        if inp.default is not None:  # an input with a default may be blank (PandaLM's empty "input"), as if missing
            return inp.default
        raise DataError("field is missing" if value is None else "field is empty", source=source, row=row,
                        field=column)
    return value


def load_faireval(path: str | Path | None = None, task: TaskSpec | str = "pairwise") -> list[dspy.Example]:
    """FairEval: answer_1 is ChatGPT's, answer_2 is Vicuna-13B's, as in the paper's Assistant 1/2."""
    path = Path(path or DATA_DIR / BUILTIN["faireval"][0])
    columns = {"id": "question_id", "answer_1": "answer_chatgpt", "answer_2": "answer_vicuna13b", "label": "human"}
    items = []
    for row, r in read_rows(path):
        label = r.get("human")
        if label not in FAIREVAL_LABELS:
            raise DataError(f"expected one of {sorted(FAIREVAL_LABELS)}, got {label!r}", source=str(path), row=row,
                            field="human")
        item = item_from_record({**r, "human": FAIREVAL_LABELS[label]}, task, columns=columns, source=str(path),
                                row=row)
        items.append(item.copy(category=r.get("category")))
    return items


def load_topical_chat(path: str | Path | None = None, task: TaskSpec | str = "pointwise") -> list[dspy.Example]:
    """Topical-Chat USR: 60 contexts x 6 responses with mean human scores per aspect (``human.<aspect>``)."""
    path = Path(path or DATA_DIR / BUILTIN["topical_chat"][0])
    spec = as_task(task)
    columns = {c.name: f"human.{c.name}" for c in spec.criteria}
    items = []
    for row, r in read_rows(path):
        item = item_from_record(r, spec, columns=columns, source=str(path), row=row)
        items.append(item.copy(system=r.get("system")))
    return items


def _flag_pairs(spec: str | None, flag: str, shape: str):
    """``(entry, left, right)`` of each ``left=right`` entry of a comma-separated flag value."""
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        left, sep, right = part.partition("=")
        if not sep or not left.strip() or not right.strip():
            raise DataError(f"{flag} entry {part!r} must look like {shape}")
        yield part, left.strip(), right.strip()


def parse_columns(spec: str | None) -> dict[str, str]:
    """``"question=prompt,answer_1=a"`` -> ``{"question": "prompt", "answer_1": "a"}``."""
    return {ours: theirs for _, ours, theirs in _flag_pairs(spec, "--columns", "field=column")}


def parse_label_map(spec: str | None) -> dict[str, str]:
    """``"0=tie,A=1"`` -> ``{"0": "tie", "A": "1"}`` (``--label-map``); a value given two labels is an error.

    Example:
        >>> parse_label_map("0=tie, A=1,B=2")
        {'0': 'tie', 'A': '1', 'B': '2'}
    """
    out: dict[str, str] = {}
    for part, key, ours in _flag_pairs(spec, "--label-map", "your_value=our_label (e.g. 0=tie)"):
        if out.setdefault(key, ours) != ours:
            raise DataError(f"--label-map gives {key!r} twice: {key}={out[key]} and {part}; say which label it is once")
    return out


def _mapped(raw, label_map: dict[str, str] | None):
    """``raw`` through ``label_map`` (keys are the value's text: a JSON 0 and a CSV "0" map alike)."""
    if not label_map or raw is None or isinstance(raw, (dict, list)):
        return raw
    return label_map.get(str(raw).strip(), raw)


def _task(task: TaskSpec | str) -> TaskSpec:
    try:
        return as_task(task)
    except ConfigError as exc:
        raise DataError(f"unknown format {task!r}: choose pairwise or pointwise, or give a task (--task)") from exc


def label_fields(task: TaskSpec | str) -> tuple[str, ...]:
    """The fields a file may give human labels in: ``label`` (the winner, pairwise) or each criterion (pointwise)."""
    task = _task(task)
    return ("label",) if task.format == "pairwise" else tuple(c.name for c in task.criteria)


def column_map(task: TaskSpec | str, columns: dict[str, str] | None = None) -> dict[str, str]:
    """Our field name -> the user's column name, for every field of the task (unmapped fields keep their name)."""
    task = _task(task)
    columns = dict(columns or {})
    allowed = set(task.input_names) | {"id"} | set(label_fields(task))
    unknown = sorted(set(columns) - allowed)
    if unknown:
        raise DataError(f"--columns names unknown fields {unknown}; {task.name} fields are {sorted(allowed)}")
    return {name: columns.get(name, name) for name in sorted(allowed)}


def _winner(raw, task: TaskSpec, source: str, row, column: str) -> str | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    aliases = {**LABELS, task.responses[0].lower(): "1", task.responses[1].lower(): "2"}
    label = aliases.get(str(raw).strip().lower())
    if label is None:
        raise DataError(f"label must be 1, 2 or tie (or a/b, {task.responses[0]}/{task.responses[1]}), got {raw!r}; "
                        "map your values with --label-map (e.g. 0=tie,A=1) or the task's label_map",
                        source=source, row=row, field=column)
    return label


def item_from_record(record: dict, task: TaskSpec | str, *, columns: dict[str, str] | None = None,
                     source: str = "input", row: int | None = None,
                     label_map: dict[str, str] | None = None) -> dspy.Example:
    """One user record as an item of ``task``, validated; errors name ``source``, ``row`` and the user's column.

    A missing or blank input takes its ``default``, or is an error (an empty judged response is kept). Pairwise
    ``label`` is 1/2/tie, a/b or a response's name; pointwise ``human`` holds None per missing criterion (None when
    all are). ``id`` defaults to the row number; a column may be a dotted path (``human.coherence``); ``label_map``
    (default: the task's) applies before labels are checked.

    Example:
        >>> item_from_record({"question": "2+2?", "answer_1": "4", "answer_2": " ", "winner": "a"}, "pairwise",
        ...                  columns={"label": "winner"}, row=1).label
        '1'
    """
    if not isinstance(record, dict):
        raise DataError(f"expected an object, got {type(record).__name__}", source=source, row=row)
    task = _task(task)
    col = column_map(task, columns)
    label_map = dict(task.label_map) if label_map is None else label_map
    raw_id = _value(record, col["id"])
    item_id = str(raw_id if raw_id not in (None, "") else row)
    texts = {i.name: _text(record, i, col[i.name], source, row) for i in task.inputs}
    if task.format == "pairwise":
        label = _winner(_mapped(_value(record, col["label"]), label_map), task, source, row, col["label"])
        return dspy.Example(id=item_id, **texts, label=label).with_inputs(*task.input_names)
    human = {}
    for c in task.criteria:
        try:
            human[c.name] = c.scale.human(_mapped(_value(record, col[c.name]), label_map))
        except ValueError as exc:
            raise DataError(str(exc), source=source, row=row, field=col[c.name]) from None
    human = human if any(v is not None for v in human.values()) else None
    return dspy.Example(id=item_id, **texts, human=human).with_inputs(*task.input_names)


SKIP_HINT = "; to skip malformed rows (counted and listed at the end), pass --skip-bad-rows"


def load_custom(path: str | Path, task: TaskSpec | str, columns: dict[str, str] | None = None, *,
                skip_bad_rows: bool = False, label_map: dict[str, str] | None = None, group_by: str | None = None,
                system: str | None = None, unlabelled=(), label_map_merge: bool = False) -> Items:
    """A user's JSONL/CSV file of ``task``; ``columns`` maps our field names to theirs (``item_from_record``).

    ``skip_bad_rows`` lists malformed rows in ``Items.skipped`` instead of raising the first (a column no row has is
    an error either way). ``label_map`` applies over the task's; a merge of two values into one label stops the load
    (``check_label_merges``) unless ``label_map_merge``. Pointwise: ``group_by``/``system`` name the columns of
    ``group_id``/``system_id`` (``check_id_kinds``); ``unlabelled`` criteria may lack label columns.
    """
    task = _task(task)
    col = column_map(task, columns)
    src = str(path)
    if task.format == "pairwise" and (group_by or system):
        raise DataError("--group-by and --system are for pointwise tasks (correlations per document or system); "
                        f"task {task.name!r} is pairwise", source=src)
    origins = {**{k: f"the task's label_map entry {k}: {v}" for k, v in task.label_map},
               **{k: f"--label-map entry {k}={v}" for k, v in (label_map or {}).items()}}
    label_map = {**dict(task.label_map), **(label_map or {})}
    rows = read_rows(path, bad_rows="keep") if skip_bad_rows else _hinted_rows(path)
    check_columns([r for _, r in rows if isinstance(r, dict)], task, col, explicit=set(columns or {}), source=src,
                  extra=(("--group-by", group_by), ("--system", system)), unlabelled=unlabelled)
    items, kept = _read_items(rows, task, col, src, label_map, skip_bad_rows=skip_bad_rows, group_by=group_by,
                              system=system)
    if not (label_map_merge or task.label_map_merge):
        check_label_merges(kept, task, col, origins, source=src)
    check_id_kinds(kept, (("--group-by", group_by), ("--system", system)), source=src)
    return items


def _read_items(rows, task: TaskSpec, col: dict[str, str], src: str, label_map: dict[str, str], *,
                skip_bad_rows: bool, group_by: str | None, system: str | None) -> tuple[Items, list]:
    """The items of ``rows`` (``load_custom``), and ``(row, record, item)`` of each for the checks across rows."""
    items, seen, skipped, kept = Items(), {}, [], []
    for row, record in rows:
        try:
            if isinstance(record, DataError):
                raise record
            item = item_from_record(record, task, columns=col, source=src, row=row, label_map=label_map)
            item = _with_ids(item, record, src, row, group_by=group_by, system=system)
            if item.id in seen:
                raise DataError(f"duplicate id {item.id!r} (first on row {seen[item.id]}): ids must be unique so "
                                "results can be matched to items", source=src, row=row, field=col["id"])
        except DataError as exc:
            if not skip_bad_rows:
                raise DataError(exc.reason + SKIP_HINT, source=exc.source, row=exc.row, field=exc.field) from exc
            # Listed once at the end of a run (and in Items.skipped): a warning per row here would repeat them.
            log.debug("skipping %s", exc)
            skipped.append(exc)
            continue
        seen[item.id] = row
        items.append(item)
        kept.append((row, record, item))
    items.skipped = skipped
    if not items and skipped:
        raise DataError(f"every row was malformed ({len(skipped)} skipped; the first: {skipped[0]})", source=src)
    return items, kept


def _native(task: TaskSpec, field: str, raw):
    """The label ``raw`` reads as without a label map (None: none)."""
    try:
        if field == "label":
            return _winner(raw, task, "", None, field)
        return task.criterion[field].scale.human(raw)
    except (DataError, ValueError):
        return None


def check_label_merges(kept: list, task: TaskSpec, col: dict[str, str], origins: dict[str, str], *,
                       source: str = "input") -> None:
    """A ``DataError`` where the label map makes two of a label column's values one label: a value it maps away
    from what it reads as by itself, and another value of the column ending on the same label (``kept``: ``(row,
    record, item)`` per row; ``origins``: each map key -> the entry that set it, for the message).
    """
    for field in label_fields(task):
        values: dict = {}  # label -> {value as text: (first row, read as without the map)}
        for row, record, item in kept:
            raw = _value(record, col[field])
            if raw is None or isinstance(raw, (dict, list)) or not str(raw).strip():
                continue
            label = item.label if field == "label" else item.human[field]
            values.setdefault(label, {}).setdefault(str(raw).strip(), (row, raw))
        for label, seen in values.items():
            moved = [v for v, (_, raw) in seen.items() if v in origins and _native(task, field, raw) != label]
            if len(seen) > 1 and moved:
                said = "; ".join(f"{v!r} (row {r}{', ' + origins[v] if v in origins else ''})"
                                 for v, (r, _) in seen.items())
                raise DataError(f"the label map makes {len(seen)} values of this column one label {label!r}: {said}. "
                                "If that is meant, pass --label-map-merge (a task file: label_map_merge: true); "
                                "else fix the map", source=source, field=col[field])


def check_id_kinds(kept: list, columns, *, source: str = "input") -> None:
    """A ``DataError`` naming both rows where an id column (``(flag, column)`` pairs: ``--group-by``, ``--system``)
    holds a number and a text that read alike (``7`` and ``"7"``), which would otherwise be one document."""
    for flag, column in columns:
        if not column:
            continue
        first: dict[str, tuple[int, object]] = {}
        for row, record, _ in kept:
            value = _value(record, column)
            before, was = first.setdefault(str(value).strip(), (row, value))
            if isinstance(was, str) != isinstance(value, str):
                raise DataError(f"the {flag} column holds {was!r} (row {before}) and {value!r} (row {row}), a number "
                                "and a text that would be read as one id; write every id of the column the same way "
                                "(all numbers or all texts)", source=source, field=column)


def _with_ids(item: dspy.Example, record: dict, source: str, row: int, *, group_by: str | None,
              system: str | None) -> dspy.Example:
    """The item with its document and system ids (never inputs: the referees do not see them)."""
    ids = {}
    for key, flag, column in (("group_id", "--group-by", group_by), ("system_id", "--system", system)):
        if column:
            value = _value(record, column)
            if value is None or isinstance(value, (dict, list)) or not str(value).strip():
                raise DataError(f"field is missing (the {flag} column)", source=source, row=row, field=column)
            ids[key] = str(value).strip()
    return item.copy(**ids) if ids else item


def file_columns(records: list[dict], limit: int = 40) -> str:
    """The columns a file has (those of its rows, in first-seen order), for an error that names a missing one.

    Example:
        >>> file_columns([{"a": 1, "b": 2}, {"a": 1, "c": 3}])
        "the file's columns: 'a', 'b', 'c'"
    """
    names = list(dict.fromkeys(str(k) for r in records for k in r if k is not None))
    shown_names = ", ".join(repr(n[:60]) for n in names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")
    return f"the file's columns: {shown_names or '(none)'}"


def check_columns(records: list[dict], task: TaskSpec, col: dict[str, str], *, explicit: set[str] = frozenset(),
                  source: str = "input", extra=(), unlabelled=()) -> None:
    """Every column the load needs is in some row, or a ``DataError`` names it and the file's columns: inputs
    without a default, an ``id`` in ``explicit`` (``--columns``), each ``extra`` ``(flag, column)``, and the label
    columns (``_check_labels``; one some rows lack is no error: metrics count ``<criterion>_missing``)."""
    if not records:
        return
    needed = [(f"input {i.name!r}", col[i.name]) for i in task.inputs if i.default is None]
    needed += [("id", col["id"])] if "id" in explicit else []
    needed += [(flag, column) for flag, column in extra if column]
    for what, column in needed:
        if not any(_has(r, column) for r in records):
            raise DataError(f"column {column!r} ({what}) is in no row; {file_columns(records)} (map yours with "
                            "--columns field=column)", source=source, field=column)
    _check_labels(records, task, col, explicit=explicit, source=source, unlabelled=unlabelled)


def _check_labels(records: list[dict], task: TaskSpec, col: dict[str, str], *, explicit, source: str,
                  unlabelled) -> None:
    """The label columns: one named in ``--columns`` must be in some row (a typo would read as "no labels"); so
    must each criterion's while any other label column is there, unless ``unlabelled`` says the file does not
    rate it. A file with no label column at all is judged without agreement figures."""
    fields = label_fields(task)
    unknown = sorted(set(unlabelled) - set(fields))
    if unknown:
        raise DataError(f"--unlabelled names {', '.join(map(repr, unknown))}, not a criterion of task "
                        f"{task.name!r} ({', '.join(fields)})", source=source)
    absent = [f for f in fields if not any(_has(r, col[f]) for r in records)]
    if len(absent) == len(fields):  # no labels at all: a file to judge, not to measure agreement on
        absent = [f for f in absent if f in explicit]
    absent = [f for f in absent if f not in unlabelled or f in explicit]
    if absent:
        named = ", ".join(f"{col[f]!r} ({f})" for f in absent)
        hint = "" if task.format == "pairwise" else \
            f"; a file that does not rate {'them' if len(absent) > 1 else 'it'}: --unlabelled {','.join(absent)}"
        raise DataError(f"label column(s) {named} in no row; {file_columns(records)} (map yours with --columns "
                        f"field=column{hint})", source=source, field=col[absent[0]])


def _hinted_rows(path):
    """``read_rows(path)``, whose row errors (bad JSON, bad bytes) name ``--skip-bad-rows`` too."""
    try:
        return read_rows(path)
    except DataError as exc:
        if exc.row is None or (exc.row == 1 and "header" in exc.reason):
            raise
        raise DataError(exc.reason + SKIP_HINT, source=exc.source, row=exc.row, field=exc.field) from exc


def load_dataset(name_or_path: str, *, fmt: str | None = None, columns: dict[str, str] | None = None,
                 task: TaskSpec | None = None, skip_bad_rows: bool = False, label_map: dict[str, str] | None = None,
                 group_by: str | None = None, system: str | None = None, unlabelled=(),
                 label_map_merge: bool = False) -> tuple[Items, str]:
    """Items and their format, from a built-in name (``faireval``, ``topical_chat``) or a JSONL/CSV file.

    ``fmt`` picks a file's built-in task when no ``task`` is given; a built-in takes only a task with its own input
    fields. The other options are ``load_custom``'s, for files only.
    """
    if task is not None:
        if fmt and fmt != task.format:
            raise DataError(f"--format {fmt} does not match task {task.name!r}, which is {task.format}")
        fmt = task.format
    if name_or_path in BUILTIN:
        if label_map or group_by or system or unlabelled or label_map_merge:
            raise DataError(f"--label-map(-merge), --group-by, --system and --unlabelled are for a file of your own, "
                            f"not {name_or_path}")
        own = BUILTIN[name_or_path][1]
        spec = task or as_task(own)
        if spec.format != own or spec.input_names != as_task(own).input_names:
            raise DataError(f"{name_or_path} holds {own} items with the fields "
                            f"{', '.join(as_task(own).input_names)}; task {spec.name!r} needs "
                            f"{', '.join(spec.input_names)}")
        loaded = load_faireval(task=spec) if name_or_path == "faireval" else load_topical_chat(task=spec)
        return Items(loaded), own
    if not fmt:
        raise DataError(f"{name_or_path}: a custom file needs --format pairwise|pointwise or --task "
                        f"(built-ins: {', '.join(BUILTIN)})")
    return load_custom(name_or_path, task or fmt, columns, skip_bad_rows=skip_bad_rows, label_map=label_map,
                       group_by=group_by, system=system, unlabelled=unlabelled, label_map_merge=label_map_merge), fmt
