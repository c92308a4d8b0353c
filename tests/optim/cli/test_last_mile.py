"""The last mile's gaps: a search's MLflow run says how its labels were read, data files are
bounded before they are read, and a LiteLLM model string stopped by a rate limit says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from repo_paths import ROOT

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from optim.search.run import run_search
from optim.search.space import SearchSpace
from optim.search.study_spec import StudySpec
from optim.tracking.runs import TrackingSpec

# ---- a search's parent run records how the labels were read ----------------------------------------------------


def _coded_pairs(path, n: int = 20) -> str:
    """Pairwise rows labelled as PandaLM codes them (0 = tie), in a column named ``winner``."""
    rows = [{"question": f"q{i}", "answer_1": f"a{i}", "answer_2": f"b{i}", "winner": i % 3} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _search(data: DataSpec, tmp_path, name: str = "read"):
    return run_search(data, DebateConfig(calibrate=False), LMSpec(cache=False),
                      study=StudySpec(name, trials=1, storage=f"sqlite:///{tmp_path / 'o.db'}"),
                      space=SearchSpace(n_roles=(1, 1), turns=(1, 1)), test=False,
                      tracking=TrackingSpec(uri=f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", log_model=False))


@pytest.mark.slow  # over a few seconds
def test_a_search_parent_run_logs_how_the_labels_were_read(workdir, tmp_path):
    path = _coded_pairs(tmp_path / "coded.jsonl")
    data = DataSpec(path, format="pairwise", columns={"label": "winner"}, label_map={"0": "tie"}, skip_bad_rows=True)
    done = _search(data, tmp_path)
    params = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}").get_run(done.mlflow_run_id).data.params
    # the same params, under the same names, as `chateval evaluate` and `chateval compile` log
    assert {k: v for k, v in params.items() if k.startswith("data.")} == {f"data.{k}": v for k, v in data.reading().items()}
    assert params["data.label_map"] == "0=tie" and params["data.columns"] == "label=winner"
    assert params["data.skip_bad_rows"] == "true" and params["data.group_by"] == "-"


@pytest.mark.slow  # over a few seconds
def test_a_search_worker_reading_labels_otherwise_is_refused_before_mlflow(workdir, tmp_path):
    """--skip-bad-rows on a clean file leaves the dataset's hash alone: the study's settings still tell the
    reading apart, so the worker gets the study's refusal and not MLflow's "changing param values"."""
    path = _coded_pairs(tmp_path / "coded.jsonl")
    data = DataSpec(path, format="pairwise", columns={"label": "winner"}, label_map={"0": "tie"})
    _search(data, tmp_path)
    with pytest.raises(ConfigError, match=r"other settings \(data: .*skip_bad_rows"):
        _search(DataSpec(path, format="pairwise", columns={"label": "winner"}, label_map={"0": "tie"},
                         skip_bad_rows=True), tmp_path)


def test_a_study_read_with_default_flags_records_no_reading_and_resumes_as_before(workdir, tmp_path):
    import optuna

    _search(DataSpec("faireval", limit=3), tmp_path, name="plain")
    study = optuna.load_study(study_name="plain", storage=f"sqlite:///{tmp_path / 'o.db'}")
    assert "data" not in study.user_attrs["settings"]  # studies recorded before this still match their settings


# ---- data files are bounded before they are read ----------------------------------------------------------------

CAP_MB = 200
ROWS = 1_000  # the child's MAX_DATA_ROWS: the files below hold 5,000 times as many rows of a few bytes

# Reads each case of argv[1] (a JSON list of [case, path]) under an address-space cap of the child's size after its
# imports plus CAP_MB; prints one JSON line: case -> the error's class and message.
CHILD = r"""
import json, resource, sys
from chateval_dspy.data import rows
from chateval_dspy.errors import ChatEvalError

rows.MAX_DATA_ROWS = int(sys.argv[2])  # the bound, made small enough that the files stay small
size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + CAP_MB * 2**20,) * 2)
results = {}
for case, path in json.loads(sys.argv[1]):
    try:
        json.loads(open(path).read()) if case == "control" else rows.read_rows(path)
        results[case] = {"error": None}
    except ChatEvalError as exc:
        results[case] = {"error": type(exc).__name__, "message": str(exc)[:500]}
    except BaseException as exc:  # MemoryError: what an unbounded read meets under the cap
        results[case] = {"error": "raw " + type(exc).__name__}
print(json.dumps(results))
""".replace("CAP_MB", str(CAP_MB))


def _data_bombs(d: Path) -> dict[str, Path]:
    """case -> file: sparse files one byte past ``MAX_DATA_FILE_BYTES`` (nothing on disk), files of tiny rows, a pipe."""
    from chateval_dspy import limits

    files = {f"big{suffix}": d / f"big{suffix}" for suffix in (".jsonl", ".json", ".csv")}
    for path in files.values():
        with open(path, "wb") as f:
            f.truncate(limits.MAX_DATA_FILE_BYTES + 1)
    n = 5_000 * ROWS
    files["array"] = d / "array.json"
    files["array"].write_bytes(b"[" + b"{}," * n + b"{}]")
    files["control"] = files["array"]
    files["lines"] = d / "lines.jsonl"
    files["lines"].write_bytes(b"{}\n" * n)
    files["csv"] = d / "rows.csv"
    files["csv"].write_bytes(b"question\n" + b"q\n" * n)
    files["pipe"] = d / "pipe.jsonl"
    os.mkfifo(files["pipe"])  # nobody writes: a plain read would wait forever
    return files


@pytest.fixture(scope="module")
def data_bombs(tmp_path_factory):
    files = _data_bombs(tmp_path_factory.mktemp("data-bombs"))
    cases = json.dumps([[case, str(path)] for case, path in files.items()])
    proc = subprocess.run([sys.executable, "-c", CHILD, cases, str(ROWS)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return files, json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_control_exhausts_the_cap(data_bombs):
    # The array of tiny rows, parsed whole, meets the cap: the cap is what the bounded reads are held to.
    assert data_bombs[1]["control"]["error"] == "raw MemoryError"


@pytest.mark.parametrize("case", ["big.jsonl", "big.json", "big.csv"])
def test_a_data_file_past_the_byte_bound_is_refused_before_it_is_read(data_bombs, case):
    from chateval_dspy import limits

    files, results = data_bombs
    got = results[case]
    assert got["error"] == "DataError", got
    assert got["message"].startswith(f"{files[case]}: the file is {limits.MAX_DATA_FILE_BYTES + 1:,} bytes, more than "
                                     f"{limits.MAX_DATA_FILE_BYTES:,} (limits.MAX_DATA_FILE_BYTES)")


@pytest.mark.parametrize("case", ["array", "lines", "csv"])
def test_a_data_file_of_too_many_rows_stops_at_the_row_past_the_bound(data_bombs, case):
    files, results = data_bombs
    got = results[case]
    assert got["error"] == "DataError", got
    row = ROWS + 2 if case == "csv" else ROWS + 1  # a CSV file's header is its row 1
    assert got["message"].startswith(f"{files[case]} row {row}: more than {ROWS:,} rows (limits.MAX_DATA_ROWS)")


def test_a_named_pipe_is_refused_not_waited_on(data_bombs):
    files, results = data_bombs
    assert results["pipe"] == {"error": "DataError", "message": f"{files['pipe']}: cannot read file: not a regular file"}


def test_a_file_at_the_row_bound_is_read_whole(tmp_path, monkeypatch):
    from chateval_dspy.data import rows as data_rows

    monkeypatch.setattr(data_rows, "MAX_DATA_ROWS", 3)
    rows = [{"question": f"q{i}", "answer_1": "a", "answer_2": "b"} for i in range(3)]
    (tmp_path / "three.json").write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "three.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "three.csv").write_text("question\nq0\nq1\nq2\n", encoding="utf-8")  # the header is no row
    assert [r for _, r in data_rows.read_rows(tmp_path / "three.json")] == rows
    assert [r for _, r in data_rows.read_rows(tmp_path / "three.jsonl")] == rows
    assert [r["question"] for _, r in data_rows.read_rows(tmp_path / "three.csv")] == ["q0", "q1", "q2"]


# ---- the summary-level bootstrap at scale ------------------------------------------------------------------------


def test_the_summary_level_report_of_thousands_of_documents_states_each_figures_documents():
    """The summary-level bootstrap at scale (its speed is benchmarks/agreement.md "Summary-level figures at scale",
    not a timed test): 5,000 documents, four criteria, the default 2,000 resamples, each figure with its own n."""
    import numpy as np

    from chateval_dspy.run.metrics import level_report

    rng = np.random.default_rng(0)
    keys = np.repeat(np.arange(5_000), 6)
    criteria = {c: (rng.integers(1, 6, keys.size).astype(float), rng.integers(1, 6, keys.size).astype(float))
                for c in "abcd"}
    report = level_report(criteria, keys, "summary", n_resamples=2_000)
    assert report["n_groups"] == 5_000
    figure = report["a_spearman_summary"]
    assert 4_900 < figure.n <= 5_000 and figure.low <= figure.value <= figure.high  # the documents where it is defined
