"""Results files (issue #10): one resumable stream for evaluate() and score, and a run key the Python API derives."""

from __future__ import annotations

import json
import os
import stat
import threading

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.task import builtin_task
from chateval_dspy.run import records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.identity import lm_identity, run_key
from chateval_dspy.run.records import ResultsStream
from chateval_dspy.testing.fake_lm import fake_lm

ONE = DebateConfig(roles=("critic",), turns=1)  # 2 calls per item


def items(n=5):
    return [dspy.Example(id=f"i{i}", question=f"q{i}", answer_1="a" * (10 + 5 * i), answer_2="b" * 30, label="1")
            .with_inputs(*builtin_task("pairwise").input_names) for i in range(n)]


def judged(cfg, xs, out, *, lm=None, program=None, **kwargs):
    lm = lm or fake_lm()
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        return evaluate(program or build_evaluator(cfg), xs, cfg, out=out, **kwargs), lm


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- evaluate() without a run key ----------------------------------------------------------------------------------


def test_another_panel_does_not_resume_a_file_silently(tmp_path):
    """A 1-referee panel over the default panel's file reported resumed: 5 and made 0 calls."""
    out = tmp_path / "results.jsonl"
    judged(DebateConfig(), items(), out)
    before, lm = out.read_bytes(), fake_lm()
    with pytest.raises(ConfigError, match="holds results of another run"):
        judged(ONE, items(), out, lm=lm)
    assert out.read_bytes() == before and lm.engine.calls == []


def test_the_same_run_still_resumes_without_a_key(tmp_path):
    """The derived key is stable, so rerunning the same call resumes it with no LM call."""
    out = tmp_path / "results.jsonl"
    judged(ONE, items(3), out)
    rerun, lm = judged(ONE, items(3), out)
    assert rerun.resumed == 3 and lm.engine.calls == [] and len(lines(out)) == 3
    assert len({r["run_key"] for r in lines(out)}) == 1 and lines(out)[0]["run_key"]


@pytest.mark.parametrize("change", ["temperature", "max_tokens", "model", "items", "compiled"])
def test_what_makes_another_run(tmp_path, change):
    """The LM's model and sampling, the items and the tuned program all belong to the key."""
    out = tmp_path / "results.jsonl"
    judged(ONE, items(3), out)
    xs, lm, program = items(3), fake_lm(), build_evaluator(ONE)
    if change == "temperature":
        lm.kwargs["temperature"] = 0.7
    elif change == "max_tokens":
        lm.kwargs["max_tokens"] = 1000
    elif change == "model":
        lm.model = "fake/another"
    elif change == "items":
        xs = [xs[0].copy(question="changed"), *xs[1:]]
    else:  # what a compile leaves: a demonstration on one referee
        program.debate.referees["critic"].judge.demos = [dspy.Example(
            question="dq", answer_1="x", answer_2="y", persona="p", discussion="d", evidence="e", score_1=7, score_2=3)]
    with pytest.raises(ConfigError, match="another run"):
        judged(ONE, xs, out, lm=lm, program=program)
    assert lm.engine.calls == []


def test_items_may_be_an_iterator(tmp_path):
    """The items are hashed for the key and judged, so an iterator is read once, not twice."""
    out = tmp_path / "results.jsonl"
    result, lm = judged(ONE, iter(items(4)), out)
    assert result.n == 4 and len(lm.engine.calls) == 8 and [r["id"] for r in lines(out)] == ["i0", "i1", "i2", "i3"]
    rerun, lm = judged(ONE, (x for x in items(4)), out)
    assert rerun.resumed == 4 and lm.engine.calls == []


def test_an_explicit_key_is_kept_as_given(tmp_path):
    """Callers with their own key (the CLI) keep resuming the files they wrote."""
    out = tmp_path / "results.jsonl"
    judged(ONE, items(2), out, run_key="cli-key")
    assert {r["run_key"] for r in lines(out)} == {"cli-key"}
    rerun, lm = judged(ONE, items(2), out, run_key="cli-key")
    assert rerun.resumed == 2 and lm.engine.calls == []
    with pytest.raises(ConfigError, match="another run"):
        judged(ONE, items(2), out)  # the derived key is not the CLI's


def test_run_key_output_is_unchanged_for_the_same_inputs():
    """The CLI's existing results files name their run by this key; it must not drift."""
    x = dspy.Example(id="1", question="q", answer_1="a", answer_2="b", label="1")
    x = x.with_inputs(*builtin_task("pairwise").input_names)
    assert run_key(DebateConfig(), {"model": "m"}, []) == "4c8451652e6c"
    assert run_key(DebateConfig(turns=3), {"model": "m", "temperature": 0.0}, [x], {"demos": []}) == "c43f3a9793a8"


def test_lm_identity_keeps_model_and_sampling_but_no_credentials():
    lm = dspy.LM("openai/m", temperature=0.3, max_tokens=99, api_key="sk-secret", api_base="http://h", num_retries=2)
    assert lm_identity(lm) == {"model": "openai/m", "temperature": 0.3, "max_tokens": 99}
    assert lm_identity(None) == {"model": None}


# --- the stream ----------------------------------------------------------------------------------------------------


def test_stream_reads_what_is_finished_and_cuts_a_torn_line(tmp_path):
    """Done ids exclude error lines; a kill's torn last line is cut before appending."""
    out = tmp_path / "r.jsonl"
    out.write_text('{"id": "a", "v": 1}\n{"id": 2, "v": 2}\n{"id": "c", "err', encoding="utf-8")
    with ResultsStream(out) as stream:
        assert stream.done == {"a", "2"} and [r["v"] for r in stream.records] == [1, 2]
        stream.append({"id": "c", "v": 3})
        assert stream.done == {"a", "2", "c"}
    assert [r["id"] for r in lines(out)] == ["a", 2, "c"]


def test_stream_drops_error_lines_atomically_and_keeps_the_rest_byte_for_byte(tmp_path):
    """An error line never counts as done; opening drops it and keeps the other lines as written."""
    out = tmp_path / "r.jsonl"
    kept = '{"id":"a",  "x": 1.50}\n{"id": "b", "x": "é"}\n'  # spacing and 1.50 would not survive a re-dump
    out.write_text('{"id":"a",  "x": 1.50}\n{"id": "e", "row": 2, "error": "bad"}\n{"id": "b", "x": "é"}\n',
                   encoding="utf-8")
    os.chmod(out, 0o644)
    stream = ResultsStream(out)
    assert stream.done == {"a", "b"} and stream.dropped_errors == 1
    assert out.read_text(encoding="utf-8") == kept
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]  # no temporary file left behind
    with stream:
        stream.append({"id": "e", "row": 2, "error": "bad"})
        assert "e" not in stream.done
    assert ResultsStream(out).done == {"a", "b"} and len(lines(out)) == 2


def test_stream_refuses_another_runs_file_and_stamps_its_key(tmp_path):
    out = tmp_path / "r.jsonl"
    with ResultsStream(out, key="k1") as stream:
        written = stream.append({"id": "a"})
    assert written == {"id": "a", "run_key": "k1"} and lines(out) == [written]
    assert ResultsStream(out, key="k1").done == {"a"}
    with pytest.raises(ConfigError, match="another run"):
        ResultsStream(out, key="k2")
    assert ResultsStream(out).done == {"a"}  # no key: a score file, not checked


def test_stream_append_is_thread_safe_whole_lines(tmp_path, monkeypatch):
    """Concurrent appends never interleave, and each line is fsynced."""
    out = tmp_path / "r.jsonl"
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(records.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with ResultsStream(out, key="k") as stream:
        def write(t):
            for i in range(50):
                stream.append({"id": f"{t}-{i}", "text": "x" * 2000})

        threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(stream.done) == 200
    got = lines(out)
    assert len(got) == 200 and len({r["id"] for r in got}) == 200 and len(synced) >= 200


def test_stream_without_a_path_passes_records_through(tmp_path):
    with ResultsStream(None, key="k") as stream:
        assert stream.append({"id": 1}) == {"id": 1, "run_key": "k"} and stream.done == {"1"}
    assert list(tmp_path.iterdir()) == []


def test_evaluate_resumes_after_a_torn_last_line(tmp_path):
    """Evaluate() reads through the same stream, so a kill mid-line costs nothing."""
    out = tmp_path / "r.jsonl"
    judged(ONE, items(3), out, run_key="k")
    text = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join(text[:2]) + text[2][:40], encoding="utf-8")  # the third line half-written
    rerun, lm = judged(ONE, items(3), out, run_key="k")
    assert rerun.resumed == 2 and rerun.n == 3 and len(lm.engine.calls) == 2
    assert [r["id"] for r in lines(out)] == ["i0", "i1", "i2"]
