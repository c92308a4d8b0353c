"""Datasets, the seeded split, and input errors that name file, row and field."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from data_files import write_jsonl

from chateval_dspy.data.loaders import (
    DATA_DIR,
    load_custom,
    load_dataset,
    load_faireval,
    load_topical_chat,
    parse_columns,
)
from chateval_dspy.data.rows import read_rows
from chateval_dspy.data.splits import SPLITS, select, split
from chateval_dspy.errors import ChatEvalError, DataError
from chateval_dspy.program.task import builtin_task


@pytest.fixture(scope="module")
def faireval():
    return load_faireval()


@pytest.fixture(scope="module")
def topical():
    return load_topical_chat()


def pair(i, **changes):
    record = {"id": f"x{i}", "question": f"q{i}", "answer_1": f"a{i}", "answer_2": f"b{i}", "label": "1"}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not ...}


def assert_names(err, path, row=None, field=None):
    text = str(err.value)
    assert path.name in text, text
    if row is not None:
        assert f"row {row}" in text, text
        assert err.value.row == row
    if field is not None:
        assert field in text, text


# --- the built-in datasets ------------------------------------------------------------------------------------


def test_faireval_items(faireval):
    assert len(faireval) == 80
    assert Counter(x.label for x in faireval) == {"1": 41, "2": 25, "tie": 14}
    assert [x.id for x in faireval] == [str(i) for i in range(1, 81)]
    first = json.loads((DATA_DIR / "faireval.jsonl").read_text().splitlines()[0])
    assert faireval[0].answer_1 == first["answer_chatgpt"] and faireval[0].answer_2 == first["answer_vicuna13b"]
    assert set(faireval[0].inputs().keys()) == {"question", "answer_1", "answer_2"}


def test_topical_chat_items(topical):
    assert len(topical) == 360
    assert len({x.id for x in topical}) == 360
    contexts = Counter(x.dialogue_history for x in topical)
    assert len(contexts) == 60 and set(contexts.values()) == {6}
    aspects = builtin_task("pointwise").ordinal_ranges
    for item in topical:
        assert set(item.human) == set(aspects)
        assert all(aspects[a][0] <= item.human[a] <= aspects[a][1] for a in aspects)
    assert set(topical[0].inputs().keys()) == {"dialogue_history", "fact", "response"}


def test_load_dataset_builtins(faireval):
    items, fmt = load_dataset("faireval")
    assert fmt == "pairwise" and len(items) == 80
    items, fmt = load_dataset("topical_chat")
    assert fmt == "pointwise" and len(items) == 360


# --- the split ------------------------------------------------------------------------------------------------


def ids(parts):
    return {name: [x.id for x in parts[name]] for name in SPLITS}


def test_split_is_deterministic_per_seed(faireval):
    assert ids(split(faireval, seed=0)) == ids(split(faireval, seed=0))
    assert ids(split(faireval, seed=0)) != ids(split(faireval, seed=1))
    assert ids(split(list(reversed(faireval)), seed=0)) == {k: v[::-1] for k, v in ids(split(faireval, seed=0)).items()}


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_is_disjoint_covering_and_stratified(faireval, seed):
    parts = split(faireval, seed=seed)
    all_ids = [i for name in SPLITS for i in ids(parts)[name]]
    assert sorted(all_ids) == sorted(x.id for x in faireval)  # covers everything, each item once
    assert len(set(all_ids)) == len(all_ids)
    assert [len(parts[s]) for s in SPLITS] == [32, 16, 32]
    # stratified: per label, 40/20/40 rounded (41 -> 16/9/16, 25 -> 10/5/10, 14 -> 6/2/6)
    expected = {"1": (16, 9, 16), "2": (10, 5, 10), "tie": (6, 2, 6)}
    for label, counts in expected.items():
        assert tuple(sum(x.label == label for x in parts[s]) for s in SPLITS) == counts
    for s in SPLITS:  # items keep their original order inside a split
        positions = [int(x.id) for x in parts[s]]
        assert positions == sorted(positions)


@pytest.mark.parametrize("seed", [0, 3])
def test_topical_chat_contexts_never_cross_splits(topical, seed):
    parts = split(topical, seed=seed)
    contexts = {s: {x.dialogue_history for x in parts[s]} for s in SPLITS}
    assert not (contexts["train"] & contexts["dev"]) and not (contexts["train"] & contexts["test"])
    assert not (contexts["dev"] & contexts["test"])
    assert [len(contexts[s]) for s in SPLITS] == [24, 12, 24]
    assert [len(parts[s]) for s in SPLITS] == [144, 72, 144]


def test_split_rejects_bad_fractions(faireval):
    with pytest.raises(ValueError, match="fractions"):
        split(faireval, fractions=(0.5, 0.5, 0.5))


def test_select(faireval):
    assert select(faireval, "all", limit=3) == faireval[:3]
    assert [x.id for x in select(faireval, "test", seed=2, limit=5)] == ids(split(faireval, seed=2))["test"][:5]
    assert len(select(faireval, "dev")) == 16
    with pytest.raises(DataError, match="unknown split 'validation'"):
        select(faireval, "validation")


# --- custom files -------------------------------------------------------------------------------------------


def test_custom_jsonl_pairwise_with_a_b_labels(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [pair(1, label="a"), pair(2, label="B"), pair(3, label="tie"),
                                                 pair(4, label=...), pair(5, label=2)])
    items = load_custom(path, "pairwise")
    assert [x.label for x in items] == ["1", "2", "tie", None, "2"]
    assert [x.id for x in items] == ["x1", "x2", "x3", "x4", "x5"]
    assert items[0].inputs().toDict() == {"question": "q1", "answer_1": "a1", "answer_2": "b1"}


def test_custom_csv_with_column_mapping(tmp_path):
    path = tmp_path / "votes.csv"
    path.write_text("key,prompt,left,right,winner\nk1,Q1,L1,R1,a\nk2,\"Q2, with comma\",L2,R2,b\nk3,Q3,L3,R3,tie\n",
                    encoding="utf-8")
    columns = parse_columns("id=key, question=prompt,answer_1=left,answer_2=right,label=winner")
    items, fmt = load_dataset(str(path), fmt="pairwise", columns=columns)
    assert fmt == "pairwise"
    assert [(x.id, x.question, x.answer_1, x.answer_2, x.label) for x in items] == [
        ("k1", "Q1", "L1", "R1", "1"), ("k2", "Q2, with comma", "L2", "R2", "2"), ("k3", "Q3", "L3", "R3", "tie")]


def test_custom_csv_without_ids_uses_row_numbers(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("question,answer_1,answer_2\nq,a,b\nq2,a2,b2\n", encoding="utf-8")
    items = load_custom(path, "pairwise")
    assert [x.id for x in items] == ["2", "3"] and all(x.label is None for x in items)


def test_custom_scoring_file(tmp_path):
    path = tmp_path / "dialogue.csv"
    path.write_text("dialogue_history,response,naturalness,coherence,engagingness,groundedness\n"
                    "h,r,2,3,1,0\n", encoding="utf-8")
    (item,) = load_custom(path, "pointwise")
    assert item.fact == "(no fact given)"
    assert item.human == {"naturalness": 2.0, "coherence": 3.0, "engagingness": 1.0, "groundedness": 0.0}
    plain = tmp_path / "plain.jsonl"
    write_jsonl(plain, [{"dialogue_history": "h", "fact": "f", "response": "r"}])
    (item,) = load_custom(plain, "pointwise")
    assert item.human is None and item.fact == "f"


def test_bom_is_ignored(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfquestion,answer_1,answer_2\nq,a,b\n")
    assert load_custom(path, "pairwise")[0].question == "q"


# --- errors name file, row and field ----------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "needle", "row", "field"), [
    ([pair(1), pair(2, answer_2=...)], "field is missing", 2, "answer_2"),
    ([pair(1), pair(2), pair(3, question="   ")], "field is empty", 3, "question"),
    ([pair(1, answer_1=42)], "expected text, got int", 1, "answer_1"),
])
def test_bad_field(tmp_path, rows, needle, row, field):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=needle) as err:
        load_custom(path, "pairwise")
    assert_names(err, path, row=row, field=field)


def test_wrong_label_value(tmp_path):
    path = write_jsonl(tmp_path / "lab.jsonl", [pair(1), pair(2, label="left")])
    with pytest.raises(DataError, match="label must be 1, 2 or tie") as err:
        load_custom(path, "pairwise")
    assert_names(err, path, row=2, field="label")


def test_wrong_label_value_through_mapped_column(tmp_path):
    path = tmp_path / "lab.csv"
    path.write_text("question,answer_1,answer_2,winner\nq,a,b,a\nq,a,b,c\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_custom(path, "pairwise", {"label": "winner"})
    assert_names(err, path, row=3, field="winner")  # the user's column name, CSV rows counted with the header


def test_mapped_column_missing_names_the_users_column(tmp_path):
    path = tmp_path / "cols.csv"
    path.write_text("prompt,a,b\nq,x,y\n", encoding="utf-8")
    # absent from every row: one error naming the column and the file's columns, no row and no --skip-bad-rows hint
    with pytest.raises(DataError, match="in no row; the file's columns: 'prompt', 'a', 'b'") as err:
        load_custom(path, "pairwise", parse_columns("question=prompt,answer_1=a,answer_2=bee"))
    assert_names(err, path, field="bee")
    assert "--skip-bad-rows" not in str(err.value)


def test_faireval_file_with_a_bad_human_label(tmp_path):
    record = {"question_id": 1, "question": "q", "answer_chatgpt": "a", "answer_vicuna13b": "b", "human": "gpt4"}
    path = write_jsonl(tmp_path / "fe.jsonl", [record])
    with pytest.raises(DataError, match="gpt4") as err:
        load_faireval(path)
    assert_names(err, path, row=1, field="human")


def test_topical_chat_file_with_out_of_range_score(tmp_path):
    human = {"naturalness": 2, "coherence": 4, "engagingness": 2, "groundedness": 1}
    path = write_jsonl(tmp_path / "tc.jsonl", [{"id": 0, "dialogue_history": "h", "fact": "f", "response": "r",
                                                 "human": human}])
    with pytest.raises(DataError, match=r"1\.\.3, got 4") as err:
        load_topical_chat(path)
    assert_names(err, path, row=1, field="human.coherence")


def test_invalid_json_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(pair(1)) + "\n\n" + '{"question": "q", \n', encoding="utf-8")
    with pytest.raises(DataError, match="not valid JSON") as err:
        read_rows(path)
    assert_names(err, path, row=3)  # blank lines still count


def test_json_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text('["q", "a", "b"]\n', encoding="utf-8")
    with pytest.raises(DataError, match="expected a JSON object, got list") as err:
        read_rows(path)
    assert_names(err, path, row=1)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_non_utf8_bytes(tmp_path, suffix):
    path = tmp_path / f"latin1{suffix}"
    if suffix == ".jsonl":
        path.write_bytes(json.dumps(pair(1)).encode() + b"\n" + '{"question": "caf\xe9"}'.encode("latin-1") + b"\n")
    else:
        path.write_bytes(b"question,answer_1,answer_2\nq,a,b\ncaf\xe9,a,b\n")
    with pytest.raises(DataError, match="not UTF-8") as err:
        load_custom(path, "pairwise")
    assert_names(err, path, row=2 if suffix == ".jsonl" else 3)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(DataError, match="cannot read file") as err:
        load_custom(path, "pairwise")
    assert_names(err, path)
    with pytest.raises(DataError, match="nowhere.jsonl"):
        load_dataset(str(path), fmt="pairwise")


def test_unreadable_file(tmp_path):
    path = tmp_path / "folder.jsonl"
    path.mkdir()  # exists, but cannot be read as a file
    with pytest.raises(DataError, match="cannot read file") as err:
        read_rows(path)
    assert_names(err, path)


def test_unknown_file_type_and_empty_file(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("hello", encoding="utf-8")
    with pytest.raises(DataError, match="unknown file type '.txt'"):
        read_rows(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="no items") as err:
        read_rows(empty)
    assert_names(err, empty)


def test_duplicate_ids(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [pair(1), pair(2), pair(3, id="x1")])
    with pytest.raises(DataError, match="duplicate id 'x1'") as err:
        load_custom(path, "pairwise")
    assert_names(err, path, row=3, field="id")


def test_duplicate_ids_through_a_mapped_column(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("key,question,answer_1,answer_2\nk1,q,a,b\nk2,q,a,b\nk1,q,a,b\n", encoding="utf-8")
    with pytest.raises(DataError, match="duplicate id 'k1'") as err:
        load_custom(path, "pairwise", {"id": "key"})
    assert_names(err, path, row=4, field="key")


def test_custom_file_needs_a_format(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [pair(1)])
    with pytest.raises(DataError, match="needs --format"):
        load_dataset(str(path))
    with pytest.raises(DataError, match="unknown format"):
        load_custom(path, "ranking")


def test_parse_columns():
    assert parse_columns(None) == {} and parse_columns("") == {}
    assert parse_columns(" question = prompt , label=winner,") == {"question": "prompt", "label": "winner"}
    for bad in ("question", "question=", "=prompt"):
        with pytest.raises(DataError, match="must look like field=column"):
            parse_columns(bad)


def test_columns_naming_unknown_fields(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [pair(1)])
    with pytest.raises(DataError, match=r"unknown fields \['prompt'\]"):
        load_custom(path, "pairwise", {"prompt": "question"})
    with pytest.raises(DataError, match="unknown fields"):
        load_custom(path, "pointwise", {"label": "x"})  # label is a pairwise field


def test_a_file_that_rates_some_criteria_says_which_it_does_not(tmp_path):
    # A criterion's label column in no row, while others are there, reads like a typo: an error naming the fix.
    path = tmp_path / "partial.csv"
    path.write_text("dialogue_history,response,naturalness\nh,r,2\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"label column\(s\) 'coherence' \(coherence\), 'engagingness' "
                                        r"\(engagingness\), 'groundedness' \(groundedness\) in no row") as err:
        load_custom(path, "pointwise")
    assert "the file's columns: 'dialogue_history', 'response', 'naturalness'" in str(err.value)
    assert "--unlabelled coherence,engagingness,groundedness" in str(err.value)
    # Said so, the other criteria are left unlabelled (and counted missing by the metrics), not a malformed row.
    (item,) = load_custom(path, "pointwise", unlabelled=("coherence", "engagingness", "groundedness"))
    assert item.human == {"naturalness": 2.0, "coherence": None, "engagingness": None, "groundedness": None}
    with pytest.raises(DataError, match="--unlabelled names 'fluency', not a criterion"):
        load_custom(path, "pointwise", unlabelled=("fluency",))
    # A file with no label column at all is judged without agreement figures.
    bare = tmp_path / "bare.csv"
    bare.write_text("dialogue_history,response\nh,r\n", encoding="utf-8")
    (item,) = load_custom(bare, "pointwise")
    assert item.human is None


def test_data_errors_are_chateval_errors():
    assert issubclass(DataError, ChatEvalError) and issubclass(DataError, ValueError)
    assert str(DataError("field is empty", source="a.jsonl", row=3, field="answer_2")) == (
        "a.jsonl row 3: field 'answer_2': field is empty")
    assert str(DataError("plain")) == "plain"


def test_header_only_csv_is_a_data_error(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text("question,answer_1,answer_2\n", encoding="utf-8")
    with pytest.raises(DataError, match="no items") as err:
        load_custom(path, "pairwise")
    assert_names(err, path)


def test_scoring_row_missing_an_aspect_keeps_the_others(tmp_path):
    full = {"dialogue_history": "h", "response": "r", "naturalness": 2, "coherence": 2, "engagingness": 2,
            "groundedness": 1}
    path = write_jsonl(tmp_path / "aspects.jsonl", [full, {k: v for k, v in full.items() if k != "coherence"}])
    first, second = load_custom(path, "pointwise")
    assert first.human["coherence"] == 2.0 and second.human["coherence"] is None
    assert second.human["naturalness"] == 2.0


def test_scoring_non_numeric_aspect_names_file_and_row(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("dialogue_history,response,naturalness,coherence,engagingness,groundedness\nh,r,2,x,2,1\n",
                    encoding="utf-8")
    with pytest.raises(DataError, match="expected a number") as err:
        load_custom(path, "pointwise")
    assert_names(err, path, row=2)


def test_scoring_non_numeric_aspect_names_the_field(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("dialogue_history,response,naturalness,coherence,engagingness,groundedness\nh,r,2,x,2,1\n",
                    encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_custom(path, "pointwise")
    assert_names(err, path, row=2, field="coherence")


def test_read_rows_can_keep_bad_rows_as_errors(tmp_path):
    """For a batch of user rows, each malformed row is its own DataError and the rest are read."""
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(json.dumps(pair(1)).encode() + b"\n{broken\n\n" + '{"q": "caf\xe9"}'.encode("latin-1")
                     + b'\n"text"\n' + json.dumps(pair(2)).encode() + b"\n")
    rows = read_rows(path, bad_rows="keep")
    assert [n for n, _ in rows] == [1, 2, 4, 5, 6]
    assert [type(r).__name__ for _, r in rows] == ["dict", "DataError", "DataError", "DataError", "dict"]
    bad = {n: r for n, r in rows if isinstance(r, DataError)}
    assert "not valid JSON" in str(bad[2]) and "not UTF-8" in str(bad[4]) and "expected a JSON object" in str(bad[5])
    assert all(path.name in str(e) and e.row == n for n, e in bad.items())


def test_csv_rows_keep_their_bad_bytes_to_themselves(tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_bytes(b'question,answer_1,answer_2\nq,a,b\ncaf\xe9,a,b\n"multi\nline",a,b\n')
    rows = read_rows(path, bad_rows="keep")
    assert rows[0] == (2, {"question": "q", "answer_1": "a", "answer_2": "b"})
    assert isinstance(rows[1][1], DataError) and rows[1][0] == 3 and "not UTF-8" in str(rows[1][1])
    assert "row 3" in str(rows[1][1]) and "question" in str(rows[1][1])
    assert rows[2][1]["question"] == "multi\nline"
    header = tmp_path / "header.csv"
    header.write_bytes(b"caf\xe9,answer_1\nq,a\n")
    with pytest.raises(DataError, match="not UTF-8") as err:
        read_rows(header, bad_rows="keep")  # no row can be read without the header
    assert_names(err, header, row=1)


def test_a_dataset_still_fails_fast_on_a_bad_row(tmp_path):
    """``chateval evaluate`` reads a dataset, which must be whole: the first bad row is an error."""
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(pair(1)) + "\n{broken\n" + json.dumps(pair(2)) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="not valid JSON") as err:
        load_dataset(str(path), fmt="pairwise")
    assert_names(err, path, row=2)
    with pytest.raises(ValueError, match="bad_rows"):
        read_rows(path, bad_rows="skip")
