"""The ``chateval`` command line, on the fake LM (resolve_lm is replaced; nothing is started or downloaded)."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

import chateval_dspy.lm.resolve
from chateval_dspy.testing.fake_lm import fake_lm
from optim.cli.main import main

BRACKET = r"-?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]"


@pytest.fixture
def fake_model(monkeypatch):
    """Patch resolve_lm where the CLI looks it up; record how it was asked for and the LM it handed out."""
    state = {"requests": [], "lms": []}

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        state["requests"].append((spec, kwargs))
        lm = fake_lm()
        state["lms"].append(lm)
        yield lm

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    return state


@pytest.fixture(autouse=True)
def _restore_logging(restore_logging):
    """main() sets logging up for a terminal (``conftest.restore_logging`` undoes it)."""


def cli(capsys, *argv):
    # MLflow logging has its own tests (test_tracking.py); here it would only write ./mlruns. Fewer bootstrap
    # resamples: these tests check what is printed, not the intervals' precision.
    code = main([*argv, "--no-mlflow", "--resamples", "200"] if argv and argv[0] == "evaluate" else list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_evaluate_faireval(tmp_path, capsys, fake_model):
    out_file = tmp_path / "r.jsonl"
    code, out, err = cli(capsys, "evaluate", "--dataset", "faireval", "--limit", "4", "--out", str(out_file),
                         "--no-progress", "--no-cache")
    assert code == 0, err
    assert "model=fake/scripted" in out and "data=faireval" in out and "items=4" in out
    assert "strategy=one_by_one" in out and "roles=general_public,critic" in out and "calibrate=True" in out
    assert re.search(r"^\s*accuracy\s+" + BRACKET, out, re.M), out
    assert re.search(r"^\s*kappa\s+-?\d\.\d{3}", out, re.M), out
    assert "majority class ('" in out  # the baseline column
    assert "calls_per_item" in out and "8.000" in out
    assert f"results: {out_file}" in out
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["id"] for r in records] == ["1", "2", "3", "4"]
    assert len(fake_model["lms"][0].engine.calls) == 4 * 8
    assert fake_model["requests"][0][0] == "embedded"


def test_evaluate_summary_shows_kappa_with_ci_on_more_items(tmp_path, capsys, fake_model):
    code, out, err = cli(capsys, "evaluate", "--dataset", "faireval", "--limit", "16",
                         "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--no-cache",
                         "--roles", "1", "--turns", "1")
    assert code == 0, err
    for metric in ("accuracy", "kappa"):
        assert re.search(rf"^\s*{metric}\s+{BRACKET}\s+{BRACKET}\s*$", out, re.M), out  # chateval and baseline


def test_evaluate_summary_kappa_has_ci_bracket_with_limit_4(tmp_path, capsys, fake_model):
    code, out, _ = cli(capsys, "evaluate", "--dataset", "faireval", "--limit", "4", "--out", str(tmp_path / "r.jsonl"),
                       "--no-progress", "--no-cache")
    assert code == 0
    assert re.search(r"^\s*kappa\s+" + BRACKET, out, re.M), out


def test_panel_flags_reach_the_config(tmp_path, capsys, fake_model):
    out_file = tmp_path / "r.jsonl"
    code, out, err = cli(capsys, "evaluate", "--dataset", "faireval", "--split", "test", "--seed", "1", "--limit", "2",
                         "--out", str(out_file), "--no-progress", "--no-cache", "--role", "scientist", "--role",
                         "critic", "--strategy", "simultaneous_talk_with_summarizer", "--turns", "3",
                         "--no-calibrate", "--aggregate", "majority", "--concurrency", "2")
    assert code == 0, err
    assert "roles=scientist,critic" in out and "turns=3" in out and "calibrate=False" in out
    assert "split=test (seed 1)" in out and "aggregate=majority" in out
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert all(r["calls"] == 2 * 3 + 2 for r in records)
    assert fake_model["requests"][0][1]["slots"] == 2 * 2  # concurrency x referees for simultaneous strategies


def test_scoring_dataset(tmp_path, capsys, fake_model):
    out_file = tmp_path / "tc.jsonl"
    code, out, err = cli(capsys, "evaluate", "--dataset", "topical_chat", "--limit", "3", "--out", str(out_file),
                         "--no-progress", "--no-cache", "--roles", "1", "--turns", "1")
    assert code == 0, err
    assert "naturalness_spearman" in out and "average_kendall" in out
    assert len(out_file.read_text().splitlines()) == 3


def test_custom_csv_with_columns(tmp_path, capsys, fake_model):
    data = tmp_path / "mine.csv"
    data.write_text("key,prompt,left,right,winner\n"
                    "k1,Q1,short,a much longer answer here,b\n"
                    "k2,Q2,a much longer answer here,short,a\n"
                    "k3,Q3,same,same,tie\n", encoding="utf-8")
    out_file = tmp_path / "out" / "mine.jsonl"  # the folder is created
    code, out, err = cli(capsys, "evaluate", "--dataset", str(data), "--format", "pairwise", "--columns",
                         "id=key,question=prompt,answer_1=left,answer_2=right,label=winner",
                         "--out", str(out_file), "--no-progress", "--no-cache", "--roles", "1", "--turns", "1")
    assert code == 0, err
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [(r["id"], r["human"], r["prediction"]) for r in records] == [("k1", "2", "2"), ("k2", "1", "1"),
                                                                          ("k3", "tie", "tie")]
    assert re.search(r"^\s*accuracy\s+1\.000 \[1\.000, 1\.000\]", out, re.M), out
    lm = fake_model["lms"][0]
    assert {c.inputs["question"] for c in lm.engine.calls} == {"Q1", "Q2", "Q3"}


def test_overwrite_replaces_an_existing_file(tmp_path, capsys, fake_model):
    out_file = tmp_path / "r.jsonl"
    out_file.write_text("old line\n", encoding="utf-8")
    code, _, err = cli(capsys, "evaluate", "--dataset", "faireval", "--limit", "1", "--out", str(out_file),
                       "--overwrite", "--no-progress", "--no-cache", "--roles", "1", "--turns", "1")
    assert code == 0, err
    lines = out_file.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["id"] == "1"


# --- errors: exit 2 with a message naming the problem, before any model is started ----------------------------


@pytest.mark.parametrize(("extra", "needle"), [
    (["--dataset", "nowhere.jsonl", "--format", "pairwise"], "nowhere.jsonl"),
    (["--dataset", "nowhere.jsonl"], "needs --format"),
    (["--dataset", "faireval", "--roles", "9"], "--roles takes 1 to 5"),
    (["--dataset", "faireval", "--role", "critic", "--role", "critic"], "roles must be distinct"),
    (["--dataset", "faireval", "--role", "astronaut"], "unknown role 'astronaut'"),
    (["--dataset", "faireval", "--turns", "0"], "turns must be a positive integer"),
    (["--dataset", "faireval", "--limit", "0"], "limit must be positive"),
    (["--dataset", "faireval", "--concurrency", "0"], "--concurrency must be positive"),
    (["--dataset", "faireval", "--same-role", "0"], "--same-role takes a positive number"),
])
def test_errors_exit_2(tmp_path, capsys, fake_model, extra, needle):
    code, out, err = cli(capsys, "evaluate", *extra, "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--no-cache")
    assert code == 2
    assert err.startswith("chateval: error: ") and needle in err, err
    assert fake_model["requests"] == []  # failed before starting any model
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(("columns", "needle"), [
    ("question", "must look like field=column"),
    ("prompt=question", "unknown fields ['prompt']"),
])
def test_bad_columns_exit_2(tmp_path, capsys, fake_model, columns, needle):
    data = tmp_path / "mine.csv"
    data.write_text("question,answer_1,answer_2\nq,a,b\n", encoding="utf-8")
    code, _, err = cli(capsys, "evaluate", "--dataset", str(data), "--format", "pairwise", "--columns", columns,
                       "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--no-cache")
    assert code == 2 and needle in err, err
    assert fake_model["requests"] == []


def test_bad_data_row_exit_2_naming_file_row_field(tmp_path, capsys, fake_model):
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"question": "q", "answer_1": "a", "answer_2": "b"}) + "\n"
                    + json.dumps({"question": " ", "answer_1": "a", "answer_2": "b"}) + "\n", encoding="utf-8")
    code, _, err = cli(capsys, "evaluate", "--dataset", str(data), "--format", "pairwise",
                       "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--no-cache")
    assert code == 2
    assert "mine.jsonl row 2: field 'question': field is empty" in err
    assert "--skip-bad-rows" in err  # The error names the way past it


def test_existing_out_that_is_not_results_exit_2(tmp_path, capsys, fake_model):
    out_file = tmp_path / "r.jsonl"
    out_file.write_text("precious results\n", encoding="utf-8")
    code, _, err = cli(capsys, "evaluate", "--dataset", "faireval", "--limit", "1", "--out", str(out_file),
                       "--no-progress", "--no-cache")
    assert code == 2
    assert f"{out_file} row 1: not a results line" in err and "--out" in err
    assert out_file.read_text() == "precious results\n"  # untouched
    assert fake_model["requests"] == []


def test_rerunning_the_same_command_resumes_and_another_run_is_refused(tmp_path, capsys, fake_model):
    out_file = tmp_path / "r.jsonl"
    args = ["evaluate", "--dataset", "faireval", "--limit", "3", "--out", str(out_file), "--no-progress", "--no-cache"]
    assert cli(capsys, *args)[0] == 0
    lines = out_file.read_text().splitlines()
    out_file.write_text("\n".join(lines[:1]) + "\n" + lines[1][:25])  # one finished item and a torn line
    code, out, err = cli(capsys, *args)
    assert code == 0 and "resumed: 1 item(s)" in err
    assert len(fake_model["lms"][-1].engine.calls) == 2 * 8  # only the two unfinished items were judged
    assert sorted(json.loads(x)["id"] for x in out_file.read_text().splitlines()) == ["1", "2", "3"]
    assert "items=3" in out
    code, _, err = cli(capsys, *args[:-2], "--turns", "1", "--no-progress", "--no-cache")
    assert code == 2 and "holds results of another run" in err


def test_unknown_strategy_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--dataset", "faireval", "--strategy", "round_robin"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "round_robin" in err and "simultaneous_talk_with_summarizer" in err


def test_roles_flags_are_mutually_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--dataset", "faireval", "--roles", "2", "--role", "critic"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_same_role_ablation_from_the_cli(tmp_path, capsys, fake_model):
    code, out, err = cli(capsys, "evaluate", "--dataset", "faireval", "--limit", "1",
                         "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--no-cache",
                         "--same-role", "3", "--turns", "1", "--no-calibrate")
    assert code == 0, err
    assert "roles=referee_1,referee_2,referee_3" in out
    assert len(fake_model["lms"][0].engine.calls) == 3


@pytest.mark.parametrize(("flags", "slots"), [
    ((), 2),                                            # one item, referees in turn, both answer orders at once
    (("--concurrency", "3"), 6),
    (("--strategy", "simultaneous_talk"), 4),           # both referees of a round at once, in both orders
])
def test_the_lm_is_laid_out_for_the_requests_in_flight(tmp_path, capsys, fake_model, flags, slots):
    code, _, err = cli(capsys, "evaluate", "--dataset", "faireval", "--limit", "1", "--out", str(tmp_path / "r.jsonl"),
                       "--no-progress", "--no-cache", *flags)
    assert code == 0, err
    assert fake_model["requests"][0][1]["slots"] == slots


def test_a_blocked_secret_is_one_line_not_a_traceback(tmp_path, capsys, fake_model, monkeypatch):
    """A key about to reach MLflow stops the run with the CLI's one-line error, exit 2."""
    secret = "sk-planted-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    data = tmp_path / f"{secret}.csv"  # the dataset's name is a logged param
    data.write_text("question,answer_1,answer_2\nQ,a,b\n", encoding="utf-8")
    code = main(["evaluate", "--dataset", str(data), "--format", "pairwise", "--roles", "1", "--turns", "1",
                 "--out", str(tmp_path / "r.jsonl"), "--no-progress", "--no-cache"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("chateval: error: refusing to log") and "Traceback" not in err and len(err.splitlines()) == 1
    assert secret not in err
