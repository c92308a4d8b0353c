"""A data file's columns beyond the task's fields that the audit reads: each answer's model family (for
self-preference) and each pair's bias type (EvalBiasBench's format: pairs with a known-correct answer). The file is
untrusted: values must be short text, and a row without them is left out of that figure, not guessed."""

from __future__ import annotations

from pathlib import Path

from chateval_dspy.errors import DataError

MAX_VALUE_CHARS = 100


def _value(record: dict, column: str, path: Path, row: int) -> str | None:
    value = record.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool) or len(str(value)) > MAX_VALUE_CHARS:
        raise DataError(f"must be text of at most {MAX_VALUE_CHARS} characters, got {str(value)[:40]!r}",
                        source=str(path), row=row, field=column)
    return str(value).strip()


def extra_columns(path: str | Path, columns: tuple[str, ...], *, id_column: str = "id") -> dict[str, tuple]:
    """Item id -> the values of ``columns`` in that row (rows missing any of them are left out). Ids are as the
    loaders give them: the ``id_column`` value, else the row number.

    Example:
        >>> p = tmp / "pairs.jsonl"
        >>> _ = p.write_text('{"id": "a", "model_1": "gpt", "model_2": "claude"}\\n{"id": "b", "model_1": "gpt"}\\n')
        >>> extra_columns(p, ("model_1", "model_2"))
        {'a': ('gpt', 'claude')}
    """
    from chateval_dspy.data.rows import read_rows

    path = Path(path)
    if not path.is_file():
        raise DataError(f"--family-columns and --bias-column read a data file; {path} is not one", source=str(path))
    out = {}
    for row, record in read_rows(path, bad_rows="raise"):
        raw_id = record.get(id_column)
        values = tuple(_value(record, c, path, row) for c in columns)
        if all(v is not None for v in values):
            out[str(raw_id if raw_id not in (None, "") else row)] = values
    return out


def families_and_types(path: str | Path, *, family_columns: tuple[str, ...] = (), bias_column: str | None = None,
                       judge_family: str | None = None, id_column: str = "id") -> dict:
    """``audit``'s keyword arguments ``families``, ``judge_family`` and ``bias_types`` for the columns given."""
    out = {}
    if family_columns:
        if len(family_columns) != 2:
            raise DataError(f"--family-columns names two columns (answer 1's model family, answer 2's), got "
                            f"{len(family_columns)}")
        out.update(families=extra_columns(path, family_columns, id_column=id_column), judge_family=judge_family)
    if bias_column:
        out["bias_types"] = {i: v[0] for i, v in extra_columns(path, (bias_column,), id_column=id_column).items()}
    return out
