"""PostgreSQL as the store that workers on many hosts share, and workers that start together on a fresh
store (SQLite or PostgreSQL, Optuna's or MLflow's). Real PostgreSQL 16 and ``mlflow server`` processes on loopback;
the LM is the scripted fake. The README's two subsections on it run as written (see ``test_readme_...``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from local_http import free_port
from mlflow_server import stop_group
from optuna.trial import TrialState
from postgres import PG_BIN, postgres  # noqa: F401 - the fixture
from readme_section import MANY_MACHINES, subsection_blocks

import chateval_dspy.lm.resolve
from chateval_dspy.testing.fake_lm import fake_lm

pytestmark = pytest.mark.slow  # real PostgreSQL and mlflow servers

PLANTED = "pw-planted-Q7x93k"  # a password in every URL: trust auth accepts it, and it must never be shown


def _runs(uri: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("chateval-dspy")
    return client.search_runs([experiment.experiment_id], max_results=1000)


def _leaks(text: str) -> bool:
    return PLANTED in text


# --- plain postgresql:// URLs, in process ---------------------------------------------------------------------


def test_search_runs_on_plain_postgresql_urls_and_never_shows_the_password(postgres, tmp_path,  # noqa: F811
                                                                           monkeypatch, capsys):
    """``--storage postgresql://...`` and ``--tracking-uri postgresql://...`` (psycopg 3, no ``+driver``) on fresh
    databases: the study, its parent run and trial runs land there; the password is in no output, param, tag,
    study attribute or file."""
    from optim.cli.main import main

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        yield fake_lm()

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    storage, uri = postgres.fresh("optuna", PLANTED), postgres.fresh("mlflow", PLANTED)
    assert storage.startswith("postgresql://") and uri.startswith("postgresql://")
    argv = ["search", "--dataset", "faireval", "--limit", "3", "--trials", "2", "--turns", "1", "--roles", "1",
            "--no-progress", "--no-log-model", "--study", "pg", "--storage", storage, "--tracking-uri", uri,
            "--resamples", "20"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "postgresql://postgres:***@127.0.0.1" in out and not _leaks(out + err)

    study = optuna.load_study(study_name="pg", storage=storage)
    assert len(study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))) == 2
    assert not _leaks(json.dumps(study.user_attrs, default=str))
    runs = _runs(uri)
    (parent,) = [r for r in runs if r.info.run_name == "search-pg"]
    # Kind and database only: the host (and any password) stay out of MLflow and the card.
    assert parent.data.params["storage"] == "postgresql:" + storage.rsplit("/", 1)[1] and parent.info.status == "FINISHED"
    assert sorted(r.data.tags["optuna.trial"] for r in runs if "optuna.trial" in r.data.tags) == ["0", "1"]
    assert not any(_leaks(repr(r.data.params) + repr(r.data.tags)) for r in runs)
    assert not any(_leaks(f.read_text(errors="replace")) for f in tmp_path.rglob("*") if f.is_file())


# --- workers that start together on a fresh store -------------------------------------------------------------

RACE = textwrap.dedent("""
    import json, pathlib, sys, time
    from chateval_dspy.lm.offline import ensure_offline
    ensure_offline()
    from optim.tracking import runs as tracking
    from optim.search import study
    me, n, plan = sys.argv[1], int(sys.argv[2]), json.loads(pathlib.Path(sys.argv[3]).read_text())

    def together(step):  # all n processes leave this at the same moment
        pathlib.Path(f"ready-{step}-{me}").touch()
        deadline = time.monotonic() + 120
        while len(list(pathlib.Path().glob(f"ready-{step}-*"))) < n:
            if time.monotonic() > deadline:
                sys.exit(f"step {step}: another process never arrived (it crashed)")
            time.sleep(0.005)

    for step, (kind, url) in enumerate(plan):
        together(step)
        if kind == "optuna":
            study.open_study("race", url, ("agreement",))
        else:
            with tracking.run("race", params={"worker": me}, uri=url):
                pass
        print("opened", step, flush=True)
""")


def test_workers_started_at_the_same_moment_on_fresh_stores_all_open_them(postgres, tmp_path):  # noqa: F811
    """Three processes open each fresh store at the same instant, two rounds of Optuna and MLflow stores on SQLite
    and PostgreSQL. Without ``optim.tracking.stores.init_lock`` most rounds crash in table creation or MLflow's migrations
    (``_alembic_tmp_experiments already exists``, duplicate keys); with it every process opens every store."""
    n, rounds = 3, 2
    plan = []
    for r in range(rounds):
        plan += [("optuna", f"sqlite:///{tmp_path / f'optuna-{r}.db'}"), ("optuna", postgres.fresh("race_optuna")),
                 ("mlflow", f"sqlite:///{tmp_path / f'mlflow-{r}.db'}"), ("mlflow", postgres.fresh("race_mlflow"))]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(i), str(n), str(tmp_path / "plan.json")], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, "\n".join(err[-3000:] for _, err in outputs)
    assert all(out.count("opened") == len(plan) for out, _ in outputs)
    for kind, url in plan:
        if kind == "optuna":
            assert optuna.load_study(study_name="race", storage=url).study_name == "race"
        else:
            assert sorted(r.data.params["worker"] for r in _runs(url)) == [str(i) for i in range(n)]


# --- the README: a PostgreSQL-backed MLflow server and two search workers ---------------------------------------

STORE = "A shared store: PostgreSQL for Optuna and MLflow"
WORKERS = "Search workers on many hosts"

# `chateval` on the test's PATH: the real CLI with the scripted fake LM behind every model, whose workers start
# their search at the same moment (as on hosts started together), so both take part in the study.
SHIM = textwrap.dedent("""\
    #!{python}
    import contextlib, os, pathlib, sys, time
    from chateval_dspy.lm.offline import ensure_offline
    ensure_offline()
    import chateval_dspy.lm.resolve
    from chateval_dspy.testing.fake_lm import fake_lm

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        yield fake_lm(latency=0.02)

    chateval_dspy.lm.resolve.resolve_lm = resolve
    from optim.cli.main import main

    ready = pathlib.Path(os.environ["SHIM_READY"])
    (ready / str(os.getpid())).touch()
    while len(list(ready.iterdir())) < int(os.environ["SHIM_WORKERS"]):
        time.sleep(0.02)
    argv = sys.argv[1:]  # fewer bootstrap resamples where a command reports CIs: these are smoke runs
    sys.exit(main([*argv, "--resamples", "20"] if argv[0] in ("evaluate", "compile", "search", "ablate") else argv))
""")


def _readme_scripts(pg: str, port: int, artifacts: Path) -> tuple[str, str]:
    """The two subsections' bash blocks with the README's placeholders swapped for this test's servers: the
    PostgreSQL URL (the fixture's, with a planted password), the MLflow host and port (loopback, a free port), and
    the artifact folder. Nothing else changes."""
    text = MANY_MACHINES.read_text(encoding="utf-8")
    swaps = {"postgresql://chateval@db.internal:5432": pg, "mlflow.internal:5000": f"127.0.0.1:{port}",
             "--host 0.0.0.0 --port 5000": f"--host 127.0.0.1 --port {port}", "/srv/mlflow-artifacts": str(artifacts)}
    missing = [k for k in swaps if k not in text]
    assert not missing, f"README placeholders changed: {missing}; update this test's swaps"
    scripts = []
    for heading in (STORE, WORKERS):
        blocks = subsection_blocks(MANY_MACHINES, heading)
        assert blocks and all(lang == "bash" for lang, _ in blocks), heading
        script = "\n".join(code for _, code in blocks)
        for old, new in swaps.items():
            script = script.replace(old, new)
        scripts.append(script)
    return scripts[0], scripts[1]


def _env(tmp_path: Path, pg: str, port: int) -> dict:
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "chateval").write_text(SHIM.format(python=sys.executable))
    (shims / "chateval").chmod(0o755)
    (tmp_path / "ready").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "OPENAI_API_KEY")}
    path = os.pathsep.join([str(shims), str(Path(sys.executable).parent), str(PG_BIN), env.get("PATH", "")])
    # A worker host's environment holds PG and MLFLOW as the store subsection exports them. The tracking server
    # runs one web worker and no job runner, to keep this test's memory small.
    return {**env, "PATH": path, "SHIM_READY": str(tmp_path / "ready"), "SHIM_WORKERS": "2",
            "PG": pg, "MLFLOW": f"http://127.0.0.1:{port}", "CHATEVAL_CACHE_DIR": str(tmp_path / "cache"),
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_WORKERS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}


def _bash(script: str, cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    # Its own session, so that the tracking server it leaves running in the background is stopped with it.
    with open(log, "wb") as out:
        return subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def test_readme_two_search_workers_share_a_postgresql_study_and_a_postgresql_backed_mlflow_server(
        postgres, tmp_path):  # noqa: F811
    """The README's store and workers subsections as written: a fresh PostgreSQL server gets two databases, an
    ``mlflow server`` on one serves artifacts itself, two ``chateval search`` processes share a study on the other.
    The trials split between them with none run twice, one parent run holds them, one worker saves the program and
    registers its pyfunc model (one version), the artifacts go through the server, and no password is shown."""
    pg, port, artifacts = postgres.url("", PLANTED).rstrip("/"), free_port(), tmp_path / "artifacts"
    store, workers = _readme_scripts(pg, port, artifacts)
    env, work = _env(tmp_path, pg, port), tmp_path / "work"
    work.mkdir()
    server = _bash(store, tmp_path, env, tmp_path / "store.log")
    try:
        assert server.wait(timeout=180) == 0, (tmp_path / "store.log").read_text()[-3000:]
        run = subprocess.run(["bash", "-e", "-c", workers], cwd=work, env=env, capture_output=True, text=True,
                             timeout=400)
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-4000:]
        _check_workers(f"{pg}/optuna", f"http://127.0.0.1:{port}", output, work, artifacts)
    finally:
        stop_group(server)


def _check_workers(storage: str, uri: str, output: str, work: Path, artifacts: Path) -> None:
    import mlflow

    study = optuna.load_study(study_name="faireval-shared", storage=storage)
    done = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(done) == 4 and len({t.user_attrs["worker"] for t in done}) == 2, output[-3000:]  # both took part
    assert sum(map(int, re.findall(r"^ran (\d+) trial", output, re.M))) == 4  # each trial run by one worker only
    for t in done:  # a panel drawn again reuses the earlier trial's figures instead of being judged again
        assert t.params not in [e.params for e in done if e.number < t.number] or "duplicate_of" in t.user_attrs

    runs = _runs(uri)
    (parent,) = [r for r in runs if r.info.run_name == "search-faireval-shared"]
    trials = [r for r in runs if "optuna.trial" in r.data.tags]
    assert sorted(int(r.data.tags["optuna.trial"]) for r in trials if r.info.status == "FINISHED") == \
        sorted(t.number for t in done)
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {parent.info.run_id}
    assert parent.info.status == "FINISHED" and "test.accuracy" in parent.data.metrics
    assert output.count("saved evaluator: programs/faireval-shared") == 1
    assert (work / "programs" / "faireval-shared" / "program.json").is_file()
    # Proxied artifacts: the run names the server's artifact service, and the files land in its destination.
    assert parent.info.artifact_uri.startswith("mlflow-artifacts:")
    assert list(artifacts.rglob("program.json"))
    (version,) = mlflow.MlflowClient(uri).search_model_versions("name='chateval-faireval'")
    assert version.run_id == parent.info.run_id
    assert not _leaks(output) and not _leaks(repr([(r.data.params, r.data.tags) for r in runs]))
