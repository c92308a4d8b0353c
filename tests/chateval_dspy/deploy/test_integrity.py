"""Results integrity: a huge CSV cell is one bad row, one writer per results file, a resumed file counts each of its
items once, failed calls are not cached calls, an output path that is a link is refused, and a killed traced run
leaves every item traced once after its rerun."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.rows import read_rows
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.engine import OpenAICompatEngine
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.run import records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.testing.fake_lm import default_responder
from chateval_dspy.testing.fake_server import FakeOpenAIServer
from optim.cli.main import main

HEADER = "question,answer_1,answer_2,label\n"
MISSING = object()
BIG = 200_000  # characters: over csv's default field limit (131,072) and the text limit (100,000)


def lines(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def _cli(args, env, cwd, code=None):
    prefix = ["-c", code] if code else ["-m", "optim.cli.main"]
    return subprocess.Popen([sys.executable, *prefix, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd)


def _wait_for_lines(path: Path, n: int, proc, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None and (not path.exists() or path.read_text().count("\n") < n):
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def _restore_logging(restore_logging):
    """main() sets logging up for a terminal (``conftest.restore_logging`` undoes it)."""


# ---- a CSV cell over the text limit ------------------------------------------------------------------------------


def huge_csv(path: Path) -> Path:
    """Two good rows around two rows with a huge cell; the second's huge cell is quoted and goes on over more lines
    (with commas), so a reader that resumed after the error mid-record would take its tail for rows."""
    big = "x" * BIG
    path.write_text(HEADER + "q1,a,b,1\n" + f"q2,{big},b,1\n" + f'q3,"{big}\ntail,with,commas\nend",b,2\n'
                    + "q4,c,d,2\n", encoding="utf-8")
    return path


def test_a_huge_csv_cell_is_its_rows_error_and_the_other_rows_are_read(tmp_path):
    rows = read_rows(huge_csv(tmp_path / "items.csv"), bad_rows="keep")
    assert [row for row, _ in rows] == [2, 3, 4, 5]
    good = [r for _, r in rows if isinstance(r, dict)]
    assert [r["question"] for r in good] == ["q1", "q4"]
    bad = [r for _, r in rows if isinstance(r, DataError)]
    assert [e.row for e in bad] == [3, 4] and all("100000 characters" in e.reason for e in bad)
    with pytest.raises(DataError, match="row 3.*100000 characters"):
        read_rows(tmp_path / "items.csv")
    # Up to the limit, a cell is read whole.
    fits = tmp_path / "fits.csv"
    fits.write_text(HEADER + f"q,{'y' * 100_000},b,1\n", encoding="utf-8")
    assert len(read_rows(fits)[0][1]["answer_1"]) == 100_000


def test_evaluate_skip_bad_rows_keeps_the_good_rows_of_a_huge_cell_file(tmp_path, capsys):
    src = huge_csv(tmp_path / "items.csv")
    with FakeOpenAIServer() as url:
        code = main(["evaluate", "--dataset", str(src), "--format", "pairwise", "--skip-bad-rows", "--roles", "1",
                     "--turns", "1", "--model", url, "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--no-mlflow",
                     "--no-cache"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "skipped 2 malformed row(s)" in err and "row 3" in err and "row 4" in err
    assert sorted(r["id"] for r in lines(tmp_path / "r.jsonl")) == ["2", "5"]


def test_score_keeps_the_good_rows_of_a_huge_cell_file(tmp_path, saved, engine):
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.deploy.scale.score_file import score_file

    src = huge_csv(tmp_path / "items.csv")
    with load(saved[1]) as judge:
        report = score_file(judge, src, tmp_path / "v.jsonl")
    assert report.total == 4 and report.scored == 2 and [row for row, _ in report.rejected] == [3, 4]


def test_a_huge_csv_cell_is_read_in_bounded_memory(tmp_path):
    """A 40 MB cell under an address-space limit of 300 MB over what the interpreter already maps: the reader never
    buffers a field past the limit (a reader with the limit lifted copies the cell several times over, 4 bytes a
    character)."""
    src = tmp_path / "huge.csv"
    with open(src, "w", encoding="utf-8") as f:
        f.write(HEADER + "q1,a,b,1\nq2,")
        for _ in range(40):
            f.write("z" * 1_000_000)
        f.write(",b,1\nq3,c,d,2\n")
    code = textwrap.dedent(f"""
        import resource, sys
        from chateval_dspy.data.rows import read_rows
        mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 300 * 2**20, resource.RLIM_INFINITY))
        rows = read_rows({str(src)!r}, bad_rows="keep")
        print([r if isinstance(r, str) else type(r).__name__ for _, r in ((n, x) for n, x in rows)])
    """)
    if not Path("/proc/self/statm").exists():
        pytest.skip("needs /proc (Linux)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['dict', 'DataError', 'dict']"


# ---- one writer per results file ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_run_on_the_same_out_is_refused_naming_the_first(tmp_path):
    env = dict(os.environ, CHATEVAL_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "r.jsonl"
    gate, answered = threading.Event(), []

    def held(call):  # the first item's calls answer; then the first run waits until the second has been refused
        answered.append(1)
        if len(answered) > 8:
            gate.wait(120)
        return default_responder(call)

    server = FakeOpenAIServer(responder=held)
    with server as url:
        args = ["evaluate", "--dataset", "faireval", "--limit", "6", "--roles", "2", "--turns", "2", "--model", url,
                "--out", str(out), "--no-progress", "--no-mlflow", "--concurrency", "1"]
        first = _cli(args, env, tmp_path)
        _wait_for_lines(out, 1, first)
        second = _cli(args, env, tmp_path)
        _, err = second.communicate(timeout=300)
        gate.set()
        assert second.returncode == 2, err
        assert f"pid {first.pid}" in err and str(out) in err
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
    got = lines(out)
    assert len(got) == 6 and len({r["id"] for r in got}) == 6
    assert len(server.requests) == 6 * 8  # the refused run made no call
    assert not (tmp_path / "r.jsonl.lock").exists()  # released at the end
    # A killed holder's lock file is stale: the next run takes it over.
    (tmp_path / "r.jsonl.lock").write_text("999999\n")
    with records.ResultsStream(out, key=got[0]["run_key"]) as stream:
        assert len(stream.done) == 6


def test_score_refuses_an_out_another_writer_holds(tmp_path, saved, engine):
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.deploy.scale.score_file import score_file

    src = tmp_path / "items.jsonl"
    src.write_text(json.dumps({"id": "a", "question": "q", "answer_1": "x", "answer_2": "y"}) + "\n")
    out = tmp_path / "v.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from chateval_dspy.run.records import ResultsStream
        with ResultsStream({str(out)!r}):
            print("held", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with load(saved[1]) as judge, pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            score_file(judge, src, out)
        assert engine.calls == [] and out.read_text() == ""
    finally:
        holder.kill()
        holder.wait()


# ---- what a resumed results file may hold ------------------------------------------------------------------------


@pytest.mark.slow
def test_foreign_and_repeated_ids_are_dropped_and_never_counted(tmp_path, capsys, caplog):
    out = tmp_path / "r.jsonl"
    with FakeOpenAIServer() as url:
        args = ["evaluate", "--dataset", "faireval", "--limit", "6", "--roles", "1", "--turns", "1", "--model", url,
                "--out", str(out), "--no-progress", "--no-mlflow", "--no-cache"]
        assert main(args) == 0
        capsys.readouterr()
        text = out.read_text().splitlines(keepends=True)
        foreign = json.dumps({**json.loads(text[0]), "id": "not-in-the-data"}) + "\n"
        out.write_text("".join(text[:4]) + foreign + text[1], encoding="utf-8")  # 4 items, a stranger, a repeat
        with caplog.at_level(logging.WARNING):
            assert main(args) == 0
    err = capsys.readouterr().err
    assert "resumed: 4 item(s)" in err, err
    assert "not-in-the-data" in caplog.text and "repeat" in caplog.text  # both said, in warnings
    got = lines(out)
    assert len(got) == 6 and len({r["id"] for r in got}) == 6 and "not-in-the-data" not in {r["id"] for r in got}


def test_score_drops_a_repeated_line_and_warns_of_a_foreign_one(tmp_path, saved, engine, caplog):
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.deploy.scale.score_file import score_file

    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"id": i, "question": "q", "answer_1": "x" * (n + 1), "answer_2": "y"}) + "\n"
                           for n, i in enumerate("abc")))
    out = tmp_path / "v.jsonl"
    with load(saved[1]) as judge:
        score_file(judge, src, out)
        text = out.read_text().splitlines(keepends=True)
        out.write_text("".join(text) + text[0] + json.dumps({**json.loads(text[1]), "id": "zz"}) + "\n")
        with caplog.at_level(logging.WARNING):
            report = score_file(judge, src, out)
    assert report.skipped == 3 and report.scored == 0
    assert "zz" in caplog.text and "repeat" in caplog.text
    assert sorted(r["id"] for r in lines(out)) == ["a", "b", "c", "zz"]  # a stranger may be an earlier input's


@pytest.mark.slow
@pytest.mark.parametrize(("field", "value"), [("calls", "lots"), ("prompt_tokens", None), ("seconds", "slow"),
                                               ("abstentions", ["x"]), ("usage_by_model", {"m": 3}),
                                               ("completion_tokens", MISSING)])
def test_a_malformed_field_names_its_line_and_field(tmp_path, capsys, field, value):
    out = tmp_path / "r.jsonl"
    with FakeOpenAIServer() as url:
        args = ["evaluate", "--dataset", "faireval", "--limit", "3", "--roles", "1", "--turns", "1", "--model", url,
                "--out", str(out), "--no-progress", "--no-mlflow", "--no-cache"]
        assert main(args) == 0
        capsys.readouterr()
        got = lines(out)
        got[1][field] = value
        if value is MISSING:
            del got[1][field]
        out.write_text("".join(json.dumps(r) + "\n" for r in got))
        before = out.read_bytes()
        assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{out} row 2: field '{field}" in err, err
    assert "Traceback" not in err and out.read_bytes() == before


# ---- failed calls ------------------------------------------------------------------------------------------------


def _lm(url, **kwargs):
    engine = OpenAICompatEngine(url, "fake-served", **kwargs)
    return dspy.LM("openai-compatible/fake-served", engine=engine, cache=False, num_retries=0)


@pytest.mark.parametrize("server", [dict(hang=True), dict(faults=[500, 500])], ids=["dead endpoint", "http 500"])
def test_failed_calls_are_not_cached_calls(tmp_path, server):
    cfg = DebateConfig(roles=("critic",), turns=1)
    item = dspy.Example(id="1", question="q", answer_1="a", answer_2="b", label="1").with_inputs(
        "question", "answer_1", "answer_2")
    with FakeOpenAIServer(**server) as url, dspy.context(lm=_lm(url, max_retries=0, timeout=0.5), adapter=DebateAdapter()):
        result = evaluate(build_evaluator(cfg), [item], cfg, out=tmp_path / "r.jsonl")
    (record,) = lines(tmp_path / "r.jsonl")
    assert record["calls"] == 2 and record["failed_calls"] == 2 and record["cached_calls"] == 0
    (used,) = record["usage_by_model"].values()
    assert used["cached_calls"] == 0 and used["failed_calls"] == 2
    assert result.cached_calls == 0 and result.failed_calls == 2
    assert result.cost()["failed_calls_per_item"] == 2 and result.cost()["cached_calls_per_item"] == 0


# ---- an output path that is a link -------------------------------------------------------------------------------


def test_overwrite_never_writes_through_a_linked_out_or_journal(tmp_path, capsys, fake_model_cli):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    link = tmp_path / "r.jsonl"
    link.symlink_to(precious)
    args = ["evaluate", "--dataset", "faireval", "--limit", "1", "--roles", "1", "--turns", "1", "--no-progress",
            "--no-mlflow", "--no-cache"]
    assert main([*args, "--out", str(link), "--overwrite"]) == 2
    assert "symbolic link" in capsys.readouterr().err and precious.read_text() == "keep me\n"
    assert main([*args, "--out", str(link)]) == 2 and precious.read_text() == "keep me\n"
    # The batch journal beside it: --overwrite empties <out>.batches, never the folder a link names.
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "journal.jsonl").write_text("mine\n")
    (tmp_path / "s.jsonl.batches").symlink_to(keep, target_is_directory=True)
    assert main([*args, "--out", str(tmp_path / "s.jsonl"), "--overwrite"]) == 2
    assert "symbolic link" in capsys.readouterr().err and (keep / "journal.jsonl").read_text() == "mine\n"
    assert fake_model_cli == []


def test_score_refuses_a_linked_out(tmp_path, saved, engine):
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.deploy.scale.score_file import score_file

    src = tmp_path / "items.jsonl"
    src.write_text(json.dumps({"id": "a", "question": "q", "answer_1": "x", "answer_2": "y"}) + "\n")
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    (tmp_path / "v.jsonl").symlink_to(precious)
    with load(saved[1]) as judge, pytest.raises(ConfigError, match="symbolic link"):
        score_file(judge, src, tmp_path / "v.jsonl")
    assert precious.read_text() == "keep me\n" and engine.calls == []


@pytest.fixture
def fake_model_cli(monkeypatch):
    """The LMs the CLI would have started (none, when it refuses first)."""
    import contextlib

    import chateval_dspy.lm.resolve
    from chateval_dspy.testing.fake_lm import fake_lm

    started = []

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        started.append(spec)
        yield fake_lm()

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    return started


# ---- a killed traced run -----------------------------------------------------------------------------------------

# The killed run: its first item is traced and stored, then tracing stalls, so the kill lands between the second
# item's results line and its trace (the window a real kill hits while MLflow's queue still holds the trace).
STALL_AFTER_ONE = """
import sys, time, mlflow
from chateval_dspy.run.tracing import emitter as tracing  # trace_record calls emitter.emit
real, seen = tracing.emit, []
def emit(*args, **kwargs):
    seen.append(1)
    if len(seen) > 1:
        time.sleep(600)
    trace_id = real(*args, **kwargs)
    mlflow.flush_trace_async_logging()
    return trace_id
tracing.emit = emit
from optim.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_killed_traced_run_leaves_every_item_traced_once_after_its_rerun(tmp_path, mlflow_db):
    import mlflow

    from optim.tracking.runs import EXPERIMENT

    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    env = dict(os.environ, CHATEVAL_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("MLFLOW_TRACKING_URI", None)
    out = tmp_path / "r.jsonl"
    with FakeOpenAIServer() as url:
        args = ["evaluate", "--dataset", "faireval", "--limit", "4", "--roles", "1", "--turns", "1", "--model", url,
                "--out", str(out), "--no-progress", "--no-mlflow", "--trace", "--tracking-uri", uri,
                "--concurrency", "1"]
        killed = _cli(args, env, tmp_path, code=STALL_AFTER_ONE)
        _wait_for_lines(out, 2, killed)
        time.sleep(0.5)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert len(lines(out)) == 2
        for _ in range(2):  # the rerun, then a rerun with nothing left to judge
            rerun = _cli(args, env, tmp_path)
            _, err = rerun.communicate(timeout=300)
            assert rerun.returncode == 0, err
    previous = mlflow.get_tracking_uri()
    try:
        mlflow.set_tracking_uri(uri)
        traces = mlflow.search_traces(locations=[mlflow.get_experiment_by_name(EXPERIMENT).experiment_id],
                                      return_type="list")
    finally:
        mlflow.set_tracking_uri(previous)
    ids = sorted(t.info.tags["chateval.item_id"] for t in traces)
    assert ids == sorted(r["id"] for r in lines(out)) and len(ids) == 4
    assert all(t.data.spans for t in traces)
