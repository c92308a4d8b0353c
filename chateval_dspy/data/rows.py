"""Data files read as rows, bounded before they are parsed: JSON Lines, a JSON array of objects, or CSV (quoted
newlines kept, errors named at the record, not the physical line). Every problem names the file and row.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
import threading
from pathlib import Path

from chateval_dspy.errors import DataError
from chateval_dspy.limits import MAX_DATA_FILE_BYTES, MAX_DATA_ROWS, MAX_TEXT_CHARS


def read_rows(path: str | Path, *, bad_rows: str = "raise") -> list[tuple[int, dict | DataError]]:
    """``(row number, record)`` pairs from a JSONL, JSON-array or CSV file.

    Rows are 1-based: JSONL lines; CSV records (the header is row 1; quoted cells may span lines); a JSON array's
    elements (a ``.json`` file starting with ``[``, as PandaLM ships its data). Past ``limits.MAX_DATA_FILE_BYTES``
    a file is refused unread, past ``MAX_DATA_ROWS`` at the row past the limit. ``bad_rows="keep"`` returns a
    malformed row as ``(row, DataError)`` in its place instead of raising (an unreadable file raises either way).
    """
    if bad_rows not in ("raise", "keep"):
        raise ValueError(f"bad_rows must be 'raise' or 'keep', got {bad_rows!r}")
    keep = bad_rows == "keep"
    path = Path(path)
    source = str(path)
    raw = _read_data_file(path, source).removeprefix(b"\xef\xbb\xbf")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        rows = _csv_rows(raw, source, keep)
    elif suffix == ".json" and raw.lstrip().startswith(b"["):
        rows = _array_rows(raw, source, keep)
    elif suffix in (".jsonl", ".json", ".ndjson"):
        rows = _jsonl_rows(raw, source, keep)
    else:
        raise DataError(f"unknown file type {suffix!r}: use .jsonl or .csv", source=source)
    if not rows:
        raise DataError("file has no items" + (" (only a header, or empty)" if suffix == ".csv" else ""), source=source)
    return rows


def _read_data_file(path: Path, source: str) -> bytes:
    """The bytes of the regular file ``path``, its size checked before reading (a pipe is refused, unblocked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise DataError(f"cannot read file: {exc.strerror or exc}", source=source) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise DataError("cannot read file: not a regular file", source=source)
    if info.st_size > MAX_DATA_FILE_BYTES:
        os.close(fd)
        raise DataError(f"the file is {info.st_size:,} bytes, more than {MAX_DATA_FILE_BYTES:,} "
                        "(limits.MAX_DATA_FILE_BYTES); split it into smaller files", source=source)
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(info.st_size + 1)  # read(n) allocates n bytes at once: the file's size, not the limit
        except OSError as exc:
            raise DataError(f"cannot read file: {exc.strerror or exc}", source=source) from exc
    if len(raw) > info.st_size:  # a half-written last row would be read as a bad one
        raise DataError("the file grew while it was read; read it once it is written", source=source)
    return raw


def _check_row_count(count: int, source: str, *, row: int | None = None) -> None:
    """A ``DataError`` at ``row`` (default: ``count``) once ``count`` rows pass ``MAX_DATA_ROWS``: rows are parsed
    into memory, a few bytes each in the file (``{}``) but hundreds once parsed."""
    if count > MAX_DATA_ROWS:
        raise DataError(f"more than {MAX_DATA_ROWS:,} rows (limits.MAX_DATA_ROWS); split the file into smaller files",
                        source=source, row=count if row is None else row)


def _jsonl_rows(raw: bytes, source: str, keep: bool) -> list[tuple[int, dict | DataError]]:
    rows = []
    # Line by line from the bytes, never a list of every line: a file of newlines would be a list of a billion.
    for i, line in enumerate(io.BytesIO(raw), start=1):
        _check_row_count(i, source)
        if not line.strip():
            continue
        try:
            rows.append((i, _json_row(line, source, i)))
        except DataError as exc:
            if not keep:
                raise
            rows.append((i, exc))
    return rows


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _array_rows(raw: bytes, source: str, keep: bool) -> list[tuple[int, dict | DataError]]:
    """A JSON array's elements as rows, parsed one at a time. A non-object element is its own ``DataError``; text
    that is not JSON stops the read even with ``keep``: where the next element starts is then unknown."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"not UTF-8 (line {line}, byte {exc.start}); re-save the file as UTF-8", source=source) from exc
    decoder, rows = json.JSONDecoder(), []
    pos = _JSON_SPACE.match(text, text.index("[") + 1).end()
    more = not text.startswith("]", pos)
    while more:
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise _array_error(f"{exc.msg} (line {exc.lineno}, column {exc.colno})", len(rows) + 1, source) from exc
        except RecursionError as exc:
            raise _array_error("nested too deeply", len(rows) + 1, source) from exc
        row = len(rows) + 1
        _check_row_count(row, source)
        error = None if isinstance(record, dict) else \
            DataError(f"expected a JSON object, got {type(record).__name__}", source=source, row=row)
        if error is not None and not keep:
            raise error
        rows.append((row, error or record))
        pos = _JSON_SPACE.match(text, pos).end()
        more = text.startswith(",", pos)
        pos = _JSON_SPACE.match(text, pos + 1).end() if more else pos
    if not text.startswith("]", pos) or _JSON_SPACE.match(text, pos + 1).end() != len(text):
        line = text.count("\n", 0, pos) + 1
        raise _array_error(f"expected ',' or the closing ']' (line {line})", len(rows) + 1, source)
    return rows


def _array_error(problem: str, element: int, source: str) -> DataError:
    return DataError(f"not valid JSON: {problem}, in or after element {element} of the array; a .json file holds one "
                     "JSON array of objects, a .jsonl file one JSON object per line", source=source)


def _json_row(line: bytes, source: str, row: int) -> dict:
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 (column {exc.start + 1}); re-save the file as UTF-8", source=source, row=row) from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON: {exc.msg} (column {exc.colno})", source=source, row=row) from exc
    except RecursionError as exc:  # a line of nested brackets: the parser's stack, not the line's size, runs out
        raise DataError("not valid JSON: nested too deeply", source=source, row=row) from exc
    if not isinstance(record, dict):
        raise DataError(f"expected a JSON object, got {type(record).__name__} (one object per line)", source=source,
                        row=row)
    return record


def _csv_rows(raw: bytes, source: str, keep: bool) -> list[tuple[int, dict | DataError]]:
    """CSV rows as ``read_rows`` gives them: a row holding non-UTF-8 bytes or a cell longer than ``MAX_TEXT_CHARS``
    is its own ``DataError`` with ``keep``, and raises without it."""
    # surrogateescape keeps every byte, so one bad byte spoils only the record (or quoted field) it sits in, and the
    # error names that record's row and column, not the physical line (a quoted cell may span many).
    text = raw.decode("utf-8", errors="surrogateescape")
    records = iter(csv_records(text, source=source))
    header = next(records, [])
    if isinstance(header, csv.Error):
        raise DataError(f"a column name is longer than {MAX_TEXT_CHARS} characters", source=source, row=1)
    if any(_undecodable(name) for name in header):
        raise DataError("not UTF-8 in the header; re-save the file as UTF-8", source=source, row=1)
    rows: list[tuple[int, dict | DataError]] = []
    row = 1  # the header is row 1, as a spreadsheet shows it; blank lines are no rows (as csv.DictReader has it)
    for cells in records:
        if cells == []:
            continue
        row += 1
        if isinstance(cells, csv.Error):
            error = DataError(f"a cell is longer than {MAX_TEXT_CHARS} characters (limits.MAX_TEXT_CHARS), more than a "
                              "judged text may hold; shorten it or leave the row out", source=source, row=row)
        else:
            record = _as_dict(header, cells)
            bad = [k for k, v in record.items() if _undecodable(v)]
            error = DataError("not UTF-8; re-save the file as UTF-8", source=source, row=row, field=bad[0]) if bad else None
        if error is not None and not keep:
            raise error
        rows.append((row, error or record))
    return rows


def _as_dict(header: list[str], cells: list[str]) -> dict:
    """A record as ``csv.DictReader`` makes it: surplus cells in a list under None, missing cells None."""
    record = dict(zip(header, cells))
    if len(cells) > len(header):
        record[None] = cells[len(header):]
    for name in header[len(cells):]:
        record[name] = None
    return record


# A line as open(newline="") splits them (only \r, \n and \r\n end one), and a run of characters that mean nothing
# to the CSV reader (neither quote, comma nor line end) under the default dialect.
_LINE = re.compile(r"[^\r\n]*(?:\r\n?|\n)|[^\r\n]+")
_PLAIN = re.compile(r'[^",\r\n]+')
_FIELD_LIMIT = threading.Lock()  # csv.field_size_limit is one setting for the whole process


class _Lines:
    """The lines of ``text`` from ``pos`` on, one at a time; ``pos`` is always where the next one starts.

    Example:
        >>> lines = _Lines("a,b\\r\\nc\\n\\nd")
        >>> list(lines), lines.pos
        (['a,b\\r\\n', 'c\\n', '\\n', 'd'], 9)
    """

    def __init__(self, text: str, pos: int = 0):
        self.text, self.pos = text, pos

    def __iter__(self):
        return self

    def __next__(self) -> str:
        match = _LINE.match(self.text, self.pos)
        if match is None:
            raise StopIteration
        self.pos = match.end()
        return match.group()


def csv_records(text: str, *, source: str = "CSV text") -> list[list[str] | csv.Error]:
    """Every record of CSV ``text`` (the header first) as its cells, or as the ``csv.Error`` of a record with a cell
    over ``MAX_TEXT_CHARS`` (skipped whole, so no cell is ever held past the limit); past ``MAX_DATA_ROWS`` records
    (blank lines included), a ``DataError``.

    Example:
        >>> csv_records('a,b\\n1,"' + "x" * 100_001 + '\\n2,3"\\n4,5\\n')
        [['a', 'b'], Error('field larger than field limit (100000)'), ['4', '5']]
    """
    with _FIELD_LIMIT:
        before = csv.field_size_limit(MAX_TEXT_CHARS)
        try:
            out: list[list[str] | csv.Error] = []
            lines = _Lines(text)
            reader = csv.reader(lines)
            while True:
                start = lines.pos
                try:
                    out.append(next(reader))
                    _check_row_count(len(out) - 1, source, row=len(out))  # the header is row 1 and no row
                except StopIteration:
                    return out
                except csv.Error as exc:
                    # The reader gave up inside the record: its rest (more lines, if a quoted cell goes on) must not
                    # be read as records of their own.
                    lines.pos = _record_end(text, start)
                    reader = csv.reader(lines)
                    out.append(exc)
        finally:
            csv.field_size_limit(before)


def _record_end(text: str, start: int) -> int:
    """Where the CSV record that starts at ``start`` ends. It is read again with every run of plain characters cut
    to one: the reader goes through the same states (in quotes or not, cell and record ends), and no cell is long."""
    lines = _Lines(text, start)
    limit = csv.field_size_limit(len(text) + 1)  # only quotes are left to make a cell long
    try:
        next(csv.reader(_PLAIN.sub("x", line) for line in lines), None)
    except csv.Error:
        pass  # not expected: the record then ends where the reader stopped
    finally:
        csv.field_size_limit(limit)
    return lines.pos


def _undecodable(value) -> bool:
    values = value if isinstance(value, list) else [value]  # DictReader puts surplus cells in a list
    return any(isinstance(v, str) and any("\udc80" <= c <= "\udcff" for c in v) for v in values)
