"""Datasets with human labels, as ``dspy.Example``s, and the seeded split every later step reuses.

Pairwise items: ``question``, ``answer_1``, ``answer_2`` in, ``label`` in {"1", "2", "tie"} (or None).
Scoring items: ``dialogue_history``, ``fact``, ``response`` in, ``human`` {aspect: score} (or None).
Every problem names the file, row and field.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import random
from collections import defaultdict
from pathlib import Path

import dspy

from chateval_dspy.errors import DataError
from chateval_dspy.program.signatures import ASPECTS, INPUTS

log = logging.getLogger(__name__)

# The built-in datasets are package data beside this module, so an installed wheel carries them.
DATA_DIR = Path(__file__).resolve().parent
BUILTIN = {
    "faireval": ("faireval.jsonl", "pairwise"),
    "topical_chat": ("topical_chat_usr.jsonl", "scoring"),
}
SPLITS = ("train", "dev", "test")
SPLIT_FRACTIONS = (0.4, 0.2, 0.4)
LABELS = {"1": "1", "2": "2", "tie": "tie", "a": "1", "b": "2", "draw": "tie"}
FAIREVAL_LABELS = {"chatgpt": "1", "vicuna13b": "2", "tie": "tie"}


def read_rows(path: str | Path, *, bad_rows: str = "raise") -> list[tuple[int, dict | DataError]]:
    """``(row number, record)`` pairs from a JSONL or CSV file; row numbers are 1-based lines.

    Args:
        path: A ``.jsonl``/``.json``/``.ndjson`` or ``.csv`` file.
        bad_rows: ``"raise"``: the first malformed row (invalid JSON, not an object, not UTF-8) raises its
            ``DataError``, as a dataset must be whole. ``"keep"``: such a row comes back as
            ``(row, DataError)`` in its place and the other rows still come back, for a batch of user rows
            where one bad row must not stop the rest. A file that cannot be read at all raises either way.
    """
    if bad_rows not in ("raise", "keep"):
        raise ValueError(f"bad_rows must be 'raise' or 'keep', got {bad_rows!r}")
    keep = bad_rows == "keep"
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read file: {exc.strerror or exc}", source=source) from exc
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    suffix = path.suffix.lower()
    if suffix == ".csv":
        if keep:
            rows = _csv_rows(raw, source)
        else:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = raw[: exc.start].count(b"\n") + 1
                raise DataError(f"not UTF-8 (byte {exc.start}); re-save the file as UTF-8", source=source,
                                row=line) from exc
            reader = csv.DictReader(io.StringIO(text, newline=""))
            # Row numbers count the header as line 1, as a spreadsheet shows them.
            rows = [(i, dict(r)) for i, r in enumerate(reader, start=2)]
        if not rows:
            raise DataError("file has no items (only a header, or empty)", source=source)
        return rows
    if suffix not in (".jsonl", ".json", ".ndjson"):
        raise DataError(f"unknown file type {suffix!r}: use .jsonl or .csv", source=source)
    rows = []
    for i, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append((i, _json_row(line, source, i)))
        except DataError as exc:
            if not keep:
                raise
            rows.append((i, exc))
    if not rows:
        raise DataError("file has no items", source=source)
    return rows


def _json_row(line: bytes, source: str, row: int) -> dict:
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 (column {exc.start + 1}); re-save the file as UTF-8", source=source, row=row) from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON: {exc.msg} (column {exc.colno})", source=source, row=row) from exc
    if not isinstance(record, dict):
        raise DataError(f"expected a JSON object, got {type(record).__name__}", source=source, row=row)
    return record


def _csv_rows(raw: bytes, source: str) -> list[tuple[int, dict | DataError]]:
    """CSV rows where a row holding non-UTF-8 bytes becomes its own ``DataError`` (``bad_rows="keep"``)."""
    # surrogateescape keeps every byte, so one bad byte spoils only the row (or quoted field) it sits in.
    text = raw.decode("utf-8", errors="surrogateescape")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if any(_undecodable(name) for name in reader.fieldnames or ()):
        raise DataError("not UTF-8 in the header; re-save the file as UTF-8", source=source, row=1)
    rows: list[tuple[int, dict | DataError]] = []
    for i, r in enumerate(reader, start=2):
        bad = [k for k, v in r.items() if _undecodable(v)]
        if bad:
            rows.append((i, DataError("not UTF-8; re-save the file as UTF-8", source=source, row=i, field=bad[0])))
        else:
            rows.append((i, dict(r)))
    return rows


def _undecodable(value) -> bool:
    values = value if isinstance(value, list) else [value]  # DictReader puts surplus cells in a list
    return any(isinstance(v, str) and any("\udc80" <= c <= "\udcff" for c in v) for v in values)


def _text(record: dict, name: str, source: str, row: int, column: str | None = None) -> str:
    column = column or name
    if column not in record or record[column] is None:
        raise DataError("field is missing", source=source, row=row, field=column)
    value = record[column]
    if not isinstance(value, str):
        raise DataError(f"expected text, got {type(value).__name__}", source=source, row=row, field=column)
    if not value.strip():
        raise DataError("field is empty", source=source, row=row, field=column)
    return value


def _example(fmt: str, item_id: str, texts: dict, **labels) -> dspy.Example:
    return dspy.Example(id=item_id, **texts, **labels).with_inputs(*INPUTS[fmt])


def _human_scores(value, source: str, row: int, column: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise DataError("expected an object of aspect scores", source=source, row=row, field=column)
    out = {}
    for aspect, (lo, hi) in ASPECTS.items():
        score = value.get(aspect)
        if isinstance(score, bool) or not isinstance(score, (int, float)) or math.isnan(score) or not lo <= score <= hi:
            raise DataError(f"expected a number in {lo}..{hi}, got {score!r}", source=source, row=row,
                            field=f"{column}.{aspect}")
        out[aspect] = float(score)
    return out


def load_faireval(path: str | Path | None = None) -> list[dspy.Example]:
    """FairEval: answer_1 is ChatGPT's, answer_2 is Vicuna-13B's, as in the paper's Assistant 1/2."""
    path = Path(path or DATA_DIR / BUILTIN["faireval"][0])
    items = []
    for row, r in read_rows(path):
        src = str(path)
        label = r.get("human")
        if label not in FAIREVAL_LABELS:
            raise DataError(f"expected one of {sorted(FAIREVAL_LABELS)}, got {label!r}", source=src, row=row, field="human")
        texts = {"question": _text(r, "question", src, row), "answer_1": _text(r, "answer_chatgpt", src, row),
                 "answer_2": _text(r, "answer_vicuna13b", src, row)}
        items.append(_example("pairwise", str(r.get("question_id", row)), texts, label=FAIREVAL_LABELS[label],
                              category=r.get("category")))
    return items


def load_topical_chat(path: str | Path | None = None) -> list[dspy.Example]:
    """Topical-Chat USR: 60 contexts x 6 responses with mean human scores per aspect."""
    path = Path(path or DATA_DIR / BUILTIN["topical_chat"][0])
    items = []
    for row, r in read_rows(path):
        src = str(path)
        texts = {k: _text(r, k, src, row) for k in INPUTS["scoring"]}
        items.append(_example("scoring", str(r.get("id", row)), texts, human=_human_scores(r.get("human"), src, row, "human"),
                              system=r.get("system")))
    return items


def parse_columns(spec: str | None) -> dict[str, str]:
    """``"question=prompt,answer_1=a"`` -> ``{"question": "prompt", "answer_1": "a"}``."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        ours, sep, theirs = part.partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise DataError(f"--columns entry {part!r} must look like field=column")
        out[ours.strip()] = theirs.strip()
    return out


def column_map(fmt: str, columns: dict[str, str] | None = None) -> dict[str, str]:
    """Our field name -> the user's column name, for every field of ``fmt`` (unmapped fields keep their name)."""
    if fmt not in INPUTS:
        raise DataError(f"unknown format {fmt!r}: choose pairwise or scoring")
    columns = dict(columns or {})
    allowed = set(INPUTS[fmt]) | {"id"} | ({"label"} if fmt == "pairwise" else set(ASPECTS))
    unknown = sorted(set(columns) - allowed)
    if unknown:
        raise DataError(f"--columns names unknown fields {unknown}; {fmt} fields are {sorted(allowed)}")
    return {name: columns.get(name, name) for name in allowed}


def item_from_record(record: dict, fmt: str, *, columns: dict[str, str] | None = None, source: str = "input",
                     row: int | None = None) -> dspy.Example:
    """One user record as an item, validated; errors name ``source``, ``row`` and the field.

    Pairwise fields: question, answer_1, answer_2, optional label (1/2/tie, or a/b), optional id.
    Scoring fields: dialogue_history, response, optional fact, optional aspect scores
    (naturalness, coherence, engagingness, groundedness: all or none), optional id.
    """
    if not isinstance(record, dict):
        raise DataError(f"expected an object, got {type(record).__name__}", source=source, row=row)
    col = column_map(fmt, columns)
    raw_id = record.get(col["id"])
    item_id = str(raw_id if raw_id not in (None, "") else row)
    if fmt == "pairwise":
        texts = {k: _text(record, k, source, row, col[k]) for k in INPUTS[fmt]}
        raw = record.get(col["label"])
        label = None
        if raw not in (None, ""):
            label = LABELS.get(str(raw).strip().lower())
            if label is None:
                raise DataError(f"label must be 1, 2 or tie (or a/b), got {raw!r}", source=source, row=row,
                                field=col["label"])
        return _example(fmt, item_id, texts, label=label)
    texts = {k: _text(record, k, source, row, col[k]) for k in ("dialogue_history", "response")}
    texts["fact"] = _text(record, "fact", source, row, col["fact"]) if col["fact"] in record else "(no fact given)"
    given = [a for a in ASPECTS if record.get(col[a]) not in (None, "")]
    human = None
    if given:
        if len(given) != len(ASPECTS):
            missing = sorted(set(ASPECTS) - set(given))
            raise DataError(f"give all four aspect columns or none; missing {missing}", source=source, row=row)
        values = {}
        for a in ASPECTS:
            try:
                values[a] = float(record[col[a]])
            except (TypeError, ValueError) as exc:
                raise DataError(f"expected a number, got {record[col[a]]!r}", source=source, row=row, field=col[a]) from exc
        human = _human_scores(values, source, row, "human")
    return _example(fmt, item_id, texts, human=human)


def load_custom(path: str | Path, fmt: str, columns: dict[str, str] | None = None) -> list[dspy.Example]:
    """A user's JSONL/CSV file; ``columns`` maps our field names to theirs (see ``item_from_record``)."""
    col = column_map(fmt, columns)
    src = str(path)
    items, seen = [], {}
    for row, record in read_rows(path):
        item = item_from_record(record, fmt, columns=col, source=src, row=row)
        if item.id in seen:
            raise DataError(f"duplicate id {item.id!r} (first on row {seen[item.id]}): ids must be unique so results "
                            "can be matched to items", source=src, row=row, field=col["id"])
        seen[item.id] = row
        items.append(item)
    return items


def load_dataset(name_or_path: str, *, fmt: str | None = None,
                 columns: dict[str, str] | None = None) -> tuple[list[dspy.Example], str]:
    """Items and their format, from a built-in name (``faireval``, ``topical_chat``) or a file."""
    if name_or_path in BUILTIN:
        return (load_faireval() if name_or_path == "faireval" else load_topical_chat()), BUILTIN[name_or_path][1]
    if not fmt:
        raise DataError(f"{name_or_path}: a custom file needs --format pairwise|scoring (built-ins: {', '.join(BUILTIN)})")
    return load_custom(name_or_path, fmt, columns), fmt


def dataset_hash(items) -> str:
    """A stable hash of the items a run saw (their ids, inputs and labels)."""
    h = hashlib.sha256()
    for x in items:
        h.update(json.dumps(x.toDict(), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _group(item: dspy.Example) -> str:
    # Topical-Chat's six responses to one context stay in one split, so no context leaks from train to test.
    return item.get("dialogue_history") or item.id


def split(items: list[dspy.Example], *, seed: int = 0, fractions=SPLIT_FRACTIONS) -> dict[str, list[dspy.Example]]:
    """Seeded, stratified train/dev/test split.

    Pairwise items are stratified by label; scoring items are split by dialogue context
    (all responses to one context land in the same split). The same seed and items
    always give the same split.

    Example:
        >>> parts = split(load_faireval(), seed=0)
        >>> [len(parts[s]) for s in SPLITS]
        [32, 16, 32]
    """
    if abs(sum(fractions) - 1) > 1e-9 or len(fractions) != 3:
        raise ValueError("fractions must be three numbers summing to 1")
    strata: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for item in items:
        stratum = str(item.get("label")) if "label" in item else "all"
        strata[stratum][_group(item)].append(item)
    rng = random.Random(seed)
    out = {s: [] for s in SPLITS}
    for stratum in sorted(strata):
        groups = sorted(strata[stratum])
        rng.shuffle(groups)
        n = len(groups)
        n_train = round(n * fractions[0])
        n_dev = round(n * (fractions[0] + fractions[1])) - n_train
        bounds = {"train": groups[:n_train], "dev": groups[n_train:n_train + n_dev], "test": groups[n_train + n_dev:]}
        for name, keys in bounds.items():
            for key in keys:
                out[name].extend(strata[stratum][key])
    order = {id(x): i for i, x in enumerate(items)}
    return {s: sorted(v, key=lambda x: order[id(x)]) for s, v in out.items()}


def select(items: list[dspy.Example], part: str = "all", *, seed: int = 0, limit: int | None = None) -> list[dspy.Example]:
    """One split (or ``all``), then the first ``limit`` items."""
    if part != "all":
        if part not in SPLITS:
            raise DataError(f"unknown split {part!r}; choose all, {', '.join(SPLITS)}")
        items = split(items, seed=seed)[part]
    return items[:limit] if limit else items
