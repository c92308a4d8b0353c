"""``score_file`` / ``chateval score`` (issues #4, #10, #11): one line per input row however often it is rerun,
columns mapped for every field, and a malformed row reported without stopping the batch."""

from __future__ import annotations

import json

import pytest
from data_files import write_jsonl

from chateval_dspy.deploy.saved.judge import load
from chateval_dspy.deploy.scale.score_file import score_file

ITEM = {"id": "a", "question": "Which?", "answer_1": "short", "answer_2": "a considerably longer answer"}
CALLS = 8  # per item: 2 referees x 2 turns x 2 orders


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def errors(path):
    return [r for r in lines(path) if r.get("error")]


# ---------------------------------------------------------------- resuming (copied from test_judge.py)


def test_score_resumes_after_an_interruption_without_repeating_calls(saved, engine, tmp_path):
    _, path = saved
    src = tmp_path / "items.jsonl"
    rows = [{**ITEM, "id": f"i{i}", "answer_1": "x" * (i + 1)} for i in range(5)]
    rows.insert(2, {"id": "bad", "question": "q", "answer_1": "a"})  # missing answer_2
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "verdicts.jsonl"

    class Stop(Exception):
        pass

    def stop_after_two(record, seen=[]):  # noqa: B006 - a counter across calls
        seen.append(record)
        if len(seen) == 2:
            raise Stop

    with load(path) as judge:
        with pytest.raises(Stop):
            score_file(judge, src, out, on_item=stop_after_two)
        calls_first = len(engine.calls)
        with open(out, "a") as f:
            f.write('{"id": "torn", "win')  # what a kill mid-write would leave
        report = score_file(judge, src, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in lines]
    assert sorted(ids) == sorted(["i0", "i1", "bad", "i2", "i3", "i4"]) and len(ids) == len(set(ids))
    assert report.skipped == 2 and report.scored == 3 and [r for r, _ in report.rejected] == [3]
    assert "answer_2" in report.rejected[0][1]
    judged = [r for r in lines if not r.get("error")]
    assert len(engine.calls) == 8 * len(judged)  # no item was judged twice
    assert calls_first == 16


# ---------------------------------------------------------------- reruns over a finished file


def test_rerunning_a_finished_file_adds_no_line(saved, engine, tmp_path):
    """3 input rows gave 3, then 4, then 5 output lines (one more error line per rerun)."""
    _, path = saved
    src = write_jsonl(tmp_path / "in.jsonl", [{**ITEM, "id": "i0"}, {"id": "bad", "question": "q", "answer_1": "a"},
                                              {**ITEM, "id": "i2"}])
    out = tmp_path / "out.jsonl"
    with load(path) as judge:
        for attempt in range(3):
            report = score_file(judge, src, out)
            assert len(lines(out)) == 3, f"attempt {attempt}"
            assert [r["id"] for r in errors(out)] == ["bad"]
            assert [r for r, _ in report.rejected] == [2]  # still reported on every run
    assert report.skipped == 2 and report.scored == 0
    assert len(engine.calls) == 2 * CALLS  # the reruns judged nothing


def test_a_row_fixed_after_a_rejection_is_scored_on_rerun(saved, engine, tmp_path):
    """A row rejected once counted as done forever, so fixing it and rerunning never scored it."""
    _, path = saved
    rows = [{**ITEM, "id": "i0"}, {"id": "bad", "question": "q", "answer_1": "a"}, {**ITEM, "id": "i2"}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    with load(path) as judge:
        score_file(judge, src, out)
        rows[1]["answer_2"] = "now given"
        write_jsonl(src, rows)
        report = score_file(judge, src, out)
    assert report.scored == 1 and report.skipped == 2 and report.rejected == []
    got = lines(out)
    assert sorted(r["id"] for r in got) == ["bad", "i0", "i2"] and errors(out) == []  # the stale error is gone
    assert next(r for r in got if r["id"] == "bad")["winner"] in ("1", "2", "tie")
    assert len(engine.calls) == 3 * CALLS


def test_duplicate_ids_keep_one_error_line_across_reruns(saved, engine, tmp_path):
    """A repeated id is one error line for its row, not one more per rerun."""
    _, path = saved
    src = write_jsonl(tmp_path / "in.jsonl", [ITEM, {**ITEM, "answer_1": "other"}])
    out = tmp_path / "out.jsonl"
    with load(path) as judge:
        score_file(judge, src, out)
        report = score_file(judge, src, out)
    assert len(lines(out)) == 2 and [r["row"] for r in errors(out)] == [2]
    assert "duplicate id 'a'" in errors(out)[0]["error"] and report.rejected[0][0] == 2
    assert len(engine.calls) == CALLS


# ---------------------------------------------------------------- --columns


def test_columns_map_every_input_field(saved, engine, tmp_path):
    """--columns question=prompt,... rejected every row ("field 'question': field is missing")."""
    _, path = saved
    src = tmp_path / "in.csv"
    src.write_text("key,prompt,a,b\nk1,Which?,short,a considerably longer answer\nk2,Which?,a long answer here,b\n",
                   encoding="utf-8")
    out = tmp_path / "out.jsonl"
    columns = {"id": "key", "question": "prompt", "answer_1": "a", "answer_2": "b"}
    with load(path) as judge:
        report = score_file(judge, src, out, columns=columns)
    assert report.rejected == [] and report.scored == 2
    assert {r["id"]: r["winner"] for r in lines(out)} == {"k1": "2", "k2": "1"}
    assert engine.calls and all("Which?" in json.dumps(c.inputs) for c in engine.calls)


def test_a_missing_mapped_column_names_the_users_column(saved, engine, tmp_path):
    """The error names the column the user mapped (prompt), which is what they can fix."""
    _, path = saved
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "q", "a": "x", "b": "y"}, {"a": "x", "b": "y"}])
    out = tmp_path / "out.jsonl"
    with load(path) as judge:
        report = score_file(judge, src, out, columns={"question": "prompt", "answer_1": "a", "answer_2": "b"})
    assert report.scored == 1 and [r for r, _ in report.rejected] == [2]
    assert "field 'prompt': field is missing" in report.rejected[0][1]


def test_the_cli_maps_columns(saved, engine, tmp_path, capsys):
    """As reported: ``chateval score PROGRAM --in file --columns question=prompt,...``."""
    from optim.cli.main import main

    _, path = saved
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": "Which?", "a": "x" * (5 + 40 * i), "b": "y" * 20}
                                              for i in range(2)])
    out = tmp_path / "out.jsonl"
    code = main(["score", str(path), "--in", str(src), "--out", str(out), "--no-progress",
                 "--columns", "question=prompt,answer_1=a,answer_2=b"])
    assert code == 0, capsys.readouterr().err
    assert "rejected: 0" in capsys.readouterr().out
    assert {r["id"]: r["winner"] for r in lines(out)} == {"r0": "2", "r1": "1"}


def test_score_prices_an_unpriced_model_when_asked(saved, engine, tmp_path, capsys):
    """``--price-per-mtok`` reaches ``load()`` from ``chateval score``; without it the
    fake model is unpriced (``cost_usd`` null, never 0)."""
    from optim.cli.main import main

    _, path = saved
    src = write_jsonl(tmp_path / "in.jsonl", [{**ITEM, "id": "p1"}])
    for name, extra in (("unpriced", []), ("priced", ["--price-per-mtok", "1,2"])):
        out = tmp_path / f"{name}.jsonl"
        assert main(["score", str(path), "--in", str(src), "--out", str(out), "--no-progress", *extra]) == 0
        (record,) = lines(out)
        tokens = (record["prompt_tokens"], record["completion_tokens"])
        assert tokens[0] > 0
        if extra:
            assert record["cost_usd"] == pytest.approx((tokens[0] * 1 + tokens[1] * 2) / 1e6)
        else:
            assert record["cost_usd"] is None
    capsys.readouterr()


# ---------------------------------------------------------------- malformed rows


def test_a_malformed_json_line_or_bad_byte_does_not_stop_the_batch(saved, engine, tmp_path):
    """One malformed JSON line or one non-UTF-8 byte stopped the batch: 0 of 4 good rows scored."""
    _, path = saved
    good = [json.dumps({**ITEM, "id": f"g{i}"}).encode() for i in range(4)]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join([good[0], b'{"id": "broken", "question": ', good[1],
                                '{"id": "latin", "question": "caf\xe9"}'.encode("latin-1"), good[2], b"[1, 2]",
                                good[3]]) + b"\n")
    out = tmp_path / "out.jsonl"
    with load(path) as judge:
        report = score_file(judge, src, out)
        assert report.total == 7 and report.scored == 4
        assert [r for r, _ in report.rejected] == [2, 4, 6]
        reasons = [reason for _, reason in report.rejected]
        assert "not valid JSON" in reasons[0] and "not UTF-8" in reasons[1] and "expected a JSON object" in reasons[2]
        assert all(str(src) in reason and f"row {row}" in reason for row, reason in report.rejected)
        assert sorted(r["id"] for r in lines(out) if not r.get("error")) == ["g0", "g1", "g2", "g3"]
        assert [(r["row"], str(src) in r["error"]) for r in errors(out)] == [(2, True), (4, True), (6, True)]
        score_file(judge, src, out)  # a rerun: still one line per row, nothing judged again
    assert len(lines(out)) == 7 and len(engine.calls) == 4 * CALLS


def test_a_bad_byte_in_one_csv_row_spoils_only_that_row(saved, engine, tmp_path):
    """The same for CSV: the row with the bad byte is rejected, the others are scored."""
    _, path = saved
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,question,answer_1,answer_2\nc1,Which?,short,a long answer\nc2,caf\xe9,short,long answer\n"
                    b"c3,Which?,a long answer,b\n")
    out = tmp_path / "out.jsonl"
    with load(path) as judge:
        report = score_file(judge, src, out)
    assert report.scored == 2 and [r for r, _ in report.rejected] == [3]
    assert "not UTF-8" in report.rejected[0][1] and str(src) in report.rejected[0][1]
    assert sorted(r["id"] for r in lines(out)) == ["#row3", "c1", "c3"]
