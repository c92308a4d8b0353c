"""Smoke test of the start-up benchmark (``python -m optim.bench startup``): it runs, writes its raw runs and figures,
renders them beside the targets, and a rerun on the same raw file measures nothing again. Timings are the
benchmark's to report (benchmarks/startup.md), never a test's to assert."""

from __future__ import annotations

import json

from optim.bench import main as bench
from optim.bench.startup import TARGETS, command


def test_each_target_starts_a_fresh_process_of_its_own():
    assert command("import chateval_dspy")[1:] == ["-c", "import chateval_dspy"]
    assert command("chateval --help")[-1] == "--help"
    assert TARGETS["import chateval_dspy"] == 1.0 and TARGETS["chateval --help"] == 0.5 and TARGETS["import dspy"] is None


def test_startup_suite_writes_its_runs_and_a_rerun_resumes_them(tmp_path, capsys):
    raw, out = tmp_path / "raw" / "startup.jsonl", tmp_path / "startup.json"
    argv = ["startup", "--runs", "2", "--only", "import chateval_dspy", "--raw", str(raw), "--out", str(out), "--markdown"]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| import chateval_dspy |" in printed and "<= 1.0" in printed and "median s (2 runs)" in printed
    lines = raw.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["target"] for line in lines] == ["import chateval_dspy"] * 2
    first = json.loads(out.read_text(encoding="utf-8"))["targets"]
    assert set(first) == {"import chateval_dspy"} and len(first["import chateval_dspy"]["runs"]) == 2

    assert bench.main(argv) == 0  # resumed: the same runs, nothing measured again
    assert raw.read_text(encoding="utf-8").splitlines() == lines
    assert json.loads(out.read_text(encoding="utf-8"))["targets"] == first
