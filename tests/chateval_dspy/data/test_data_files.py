"""Data files read as people ship them: a CSV error at its record, a JSON array read, and
document ids written as a number and as a text never merged."""

from __future__ import annotations

import json

import pytest
from data_files import LIKERT, write_jsonl

from chateval_dspy.data.loaders import load_custom
from chateval_dspy.data.rows import read_rows
from chateval_dspy.errors import DataError
from chateval_dspy.program.task import TaskSpec

# ---- a CSV error at its record ---------------------------------------------------------------------------------


def csv_with_quoted_newlines(tmp_path):
    """Records 2-4 hold quoted cells spanning three lines each; record 5 (line 11 on) holds a Latin-1 byte."""
    lines = ["question,answer_1,answer_2,label"]
    lines += [f'q{i},"line one\nline two\nline three",b,1' for i in range(3)]
    body = "\n".join(lines).encode() + b'\nq3,"caf\xe9\nau lait\nnoir",b,2\nq4,a,b,1\n'
    path = tmp_path / "quoted.csv"
    path.write_bytes(body)
    return path


def test_a_bad_byte_in_a_csv_with_quoted_newlines_is_reported_at_its_record(tmp_path):
    path = csv_with_quoted_newlines(tmp_path)
    with pytest.raises(DataError) as err:
        read_rows(path)
    assert err.value.row == 5 and err.value.field == "answer_1", str(err.value)
    assert "not UTF-8" in str(err.value)
    with pytest.raises(DataError, match="row 5: field 'answer_1'.*--skip-bad-rows"):
        load_custom(path, "pairwise")
    items = load_custom(path, "pairwise", skip_bad_rows=True)
    assert [x.question for x in items] == ["q0", "q1", "q2", "q4"]
    assert [e.row for e in items.skipped] == [5]


# ---- a JSON array ------------------------------------------------------------------------------------------------


PANDALM_ROWS = [{"idx": i, "question": f"q{i}", "answer_1": "a", "answer_2": "b", "label": label}
                for i, label in enumerate(["1", "2", "tie"])]


def test_a_json_array_file_is_read_element_by_element(tmp_path):
    path = tmp_path / "pandalm.json"
    path.write_text(json.dumps(PANDALM_ROWS, indent=4), encoding="utf-8")  # pretty-printed, as PandaLM ships it
    assert [row for row, _ in read_rows(path)] == [1, 2, 3]
    items = load_custom(path, "pairwise", {"id": "idx"})
    assert [(x.id, x.label) for x in items] == [("0", "1"), ("1", "2"), ("2", "tie")]
    assert len(load_custom(path, "pairwise", {"id": "idx"}, skip_bad_rows=True)) == 3


def test_a_json_arrays_bad_element_is_its_row_and_can_be_skipped(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([PANDALM_ROWS[0], "not an object", PANDALM_ROWS[2]]), encoding="utf-8")
    with pytest.raises(DataError, match=r"row 2: expected a JSON object, got str"):
        load_custom(path, "pairwise")
    items = load_custom(path, "pairwise", skip_bad_rows=True)
    assert [x.question for x in items] == ["q0", "q2"] and [e.row for e in items.skipped] == [2]


@pytest.mark.parametrize(("text", "where"), [
    ('[{"question": "q", "answer_1": "a", "answer_2": "b"},\n {"question": }]', "line 2"),
    ('[{"question": "q", "answer_1": "a", "answer_2": "b"},]', "element 2"),
    ('[{"question": "q", "answer_1": "a", "answer_2": "b"}] {"question": "q2"}', "closing ']'"),
    ('[{"question": "q", "answer_1": "a", "answer_2": "b"}', "closing ']'"),
])
def test_a_json_array_that_is_not_json_says_what_is_expected_skipping_or_not(tmp_path, text, where):
    path = tmp_path / "p.json"
    path.write_text(text, encoding="utf-8")
    for skip in (False, True):
        with pytest.raises(DataError) as err:
            load_custom(path, "pairwise", skip_bad_rows=skip)
        message = str(err.value)
        assert where in message and "one JSON array of objects" in message and "one JSON object per line" in message
        assert "every row was malformed" not in message and "--skip-bad-rows" not in message


def test_an_empty_json_array_has_no_items_and_jsonl_named_json_still_reads(tmp_path):
    empty = tmp_path / "e.json"
    empty.write_text(" [ ]\n", encoding="utf-8")
    with pytest.raises(DataError, match="no items"):
        read_rows(empty)
    lines = tmp_path / "l.json"
    write_jsonl(lines, PANDALM_ROWS)
    assert [row for row, _ in read_rows(lines)] == [1, 2, 3]


def test_a_jsonl_line_holding_an_array_says_one_object_per_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(PANDALM_ROWS) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"row 1: expected a JSON object, got list \(one object per line\)"):
        read_rows(path)


# ---- document and system ids -----------------------------------------------------------------------------------


def rated(doc_ids, column="doc") -> list[dict]:
    return [{"answer": f"a{i}", "quality": 1 + i % 5, column: d} for i, d in enumerate(doc_ids)]


@pytest.mark.parametrize("flag", ["group_by", "system"])
def test_an_id_written_as_a_number_and_as_a_text_is_an_error_naming_both_rows(tmp_path, flag):
    path = str(write_jsonl(tmp_path / "s.jsonl", rated([7, 8, "8", "7"], column="key")))
    task = TaskSpec.from_dict(LIKERT)
    for skip in (False, True):  # a column's mix is the file's problem, not one row's: never skipped
        with pytest.raises(DataError) as err:
            load_custom(path, task, **{flag: "key"}, skip_bad_rows=skip)
        message = str(err.value)
        assert "field 'key'" in message and "8 (row 2) and '8' (row 3)" in message, message
        assert f"--{flag.replace('_', '-')}" in message


def test_ids_of_one_kind_or_that_differ_load(tmp_path):
    task = TaskSpec.from_dict(LIKERT)
    for ids in ([7, 7, 8], ["7", "7", "8"], [7, "8", 9]):
        items = load_custom(str(write_jsonl(tmp_path / "s.jsonl", rated(ids))), task, group_by="doc")
        assert [x.group_id for x in items] == [str(i) for i in ids]
