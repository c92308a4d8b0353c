"""The evaluator as an MLflow model that Spark scores with.

The README subsection "The evaluator in MLflow's registry, on Spark" is run as written, in a temporary folder (its
default MLflow store under ./mlruns), with two stated substitutions: its LM URL ``http://127.0.0.1:8000/v1`` becomes
the scripted fake OpenAI-compatible server's, and ``data/examples/items.jsonl`` is copied there. Its commands run
in-process (``optim.cli.main.main``); its Python block runs with real PySpark ``local[2]``, once with
``env_manager="uv"``: the environment is rebuilt from the model alone (its wheel and pinned requirements) and PyPI.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from java_runtime import missing as why_no_spark
from readme_section import MANY_MACHINES, ROOT, subsection_blocks

from chateval_dspy.lm.spec import LMSpec

pytestmark = pytest.mark.slow  # a real Spark session and rebuilt model environments

HEADING = "The evaluator in MLflow's registry, on Spark"
README_URL = "http://127.0.0.1:8000/v1"
VERDICTS = {"1", "2", "tie"}


def _why_no_uv() -> str | None:
    if shutil.which("uv", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")) is None:
        return "uv is not installed (pip install uv): env_manager='uv' rebuilds the model's environment with it"
    return why_no_spark()


needs_spark = pytest.mark.skipif(why_no_spark() is not None, reason=why_no_spark() or "")
needs_uv = pytest.mark.skipif(_why_no_uv() is not None, reason=_why_no_uv() or "")


def run_commands(code: str, url: str, mp: pytest.MonkeyPatch) -> None:
    """The README's bash block, line by line: ``export`` sets the variable, ``chateval ...`` runs in-process."""
    from optim.cli.main import main

    for line in code.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("export "):
            name, value = line[len("export "):].split("=", 1)
            mp.setenv(name, value.replace(README_URL, url))
        elif line:
            argv = shlex.split(os.path.expandvars(line))
            assert argv[0] == "chateval", line
            assert main(argv[1:]) == 0, line


@pytest.fixture(scope="module")
def registered(tmp_path_factory, java_home):
    """The README's commands run as written (compile and search, both with --register) and a local Spark session;
    yields (folder, fake server URL, the session, the README's items as a Spark DataFrame)."""
    from pyspark.sql import SparkSession

    from chateval_dspy.testing.fake_server import FakeOpenAIServer

    (_, commands), _ = subsection_blocks(MANY_MACHINES, HEADING)
    here = tmp_path_factory.mktemp("spark-model")
    (here / "data/examples").mkdir(parents=True)
    shutil.copy(ROOT / "data/examples/items.jsonl", here / "data/examples/items.jsonl")
    with pytest.MonkeyPatch.context() as mp, FakeOpenAIServer() as url:
        mp.chdir(here)
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_PICKLE_DESERIALIZATION"):
            mp.delenv(name, raising=False)
        mp.setenv("CHATEVAL_CACHE_DIR", str(here / "cache"))
        # Spark's Python workers run this interpreter; uv is found beside it.
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        mp.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        mp.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        run_commands(commands, url, mp)
        # The README's block asks for the same master: getOrCreate hands it this session.
        spark = SparkSession.builder.master("local[2]").getOrCreate()
        try:
            yield here, url, spark, spark.read.json("data/examples/items.jsonl")
        finally:
            spark.stop()


def judged(uri: str, here: Path, url: str) -> dict[str, str]:
    """Each README item's winner as the registered judge gives it in Python (the JSON evaluator, same LM)."""
    import chateval_dspy

    items = [json.loads(line) for line in (here / "data/examples/items.jsonl").read_text().splitlines()]
    with chateval_dspy.load(uri, lm=LMSpec(model=url)) as judge:
        return {it["id"]: judge(it).winner for it in items}


@needs_uv
def test_the_readme_scores_registered_models_on_spark_rebuilding_the_env_from_the_model(registered):
    """The README's Python block as written: struct rows with env_manager="uv" (the environment rebuilt from the
    model's wheel and pins, and PyPI), strings in the local env; verdicts as the judge gives them, never ids."""
    here, url, _, _ = registered
    (_, python), = [b for b in subsection_blocks(MANY_MACHINES, HEADING) if b[0] == "python"]
    namespace: dict = {}
    exec(compile(python, "README (Spark)", "exec"), namespace)
    compiled = judged("models:/chateval-judge/1", here, url)
    rows = namespace["verdicts"].collect()
    assert {r["id"]: r["verdict"] for r in rows} == compiled and set(compiled.values()) <= VERDICTS
    assert all(r["error"] is None and r["cost_usd"] is None for r in rows)  # the fake server's model is unpriced
    searched = judged("models:/chateval-judge-searched/1", here, url)
    assert {r["id"]: r["winner"] for r in namespace["winners"]} == searched and set(searched.values()) <= VERDICTS


@needs_spark
def test_registered_models_carry_the_wheel_and_pinned_requirements_not_the_package(registered):
    """Both commands register the pyfunc (dspy flavour logged, unregistered); each holds its wheel, exact pins."""
    import mlflow
    from mlflow.models import Model

    here, _, _, _ = registered
    client = mlflow.MlflowClient()
    assert {m.name for m in client.search_registered_models()} == {"chateval-judge", "chateval-judge-searched"}
    for name, out in (("chateval-judge", "programs/judge"), ("chateval-judge-searched", "programs/searched")):
        local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/1", dst_path=str(here / "dl" / name)))
        meta = Model.load(local / "MLmodel")
        pyfunc = meta.flavors["python_function"]
        assert set(meta.flavors) == {"python_function"} and pyfunc.get("code") is None
        assert not (local / "code").exists()  # the wheel is the package's only copy
        wheel = pyfunc["artifacts"]["wheel"]["path"]
        requirements = (local / "requirements.txt").read_text().splitlines()
        assert requirements[-2:] == [wheel, "-c constraints.txt"] and (local / "constraints.txt").is_file()
        assert (local / wheel).is_file() and wheel.endswith("-py3-none-any.whl")
        assert all("==" in r for r in requirements[:-2]) and "mlflow==3.17.2" in requirements
        assert not [r for r in requirements if r.startswith(("xllamacpp", "gemma3"))]  # the LM is external
        assert not any(r.startswith("chateval-dspy") for r in requirements)  # no registry name to confuse
        assert [c["name"] for c in meta.signature.outputs.to_dict()][:2] == ["verdict", "id"]
        assert meta.signature.inputs.input_names() == ["question", "answer_1", "answer_2", "id"]
        card = json.loads((local / pyfunc["artifacts"]["evaluator"]["path"] / "card.json").read_text())
        assert card == json.loads((here / out / "card.json").read_text())  # the program the command saved
        run = client.get_run(client.get_model_version(name, "1").run_id)
        logged = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list",
                                             filter_string=f"source_run_id = '{run.info.run_id}'")
        assert {"evaluator", "pyfunc"} <= {m.name for m in logged}  # the dspy flavour beside the pyfunc
    assert "search" in card  # the searched model is the best panel, from the study's run


@needs_spark
def test_string_and_struct_results_of_both_models_in_the_local_env(registered):
    """Compile's and search's models, as strings and as structs (env_manager="local"): the verdict, never the id."""
    import mlflow
    from pyspark.sql.functions import struct

    from chateval_dspy.deploy.saved.verdicts import RESULT_TYPE

    here, url, spark, items = registered
    cols = struct(*items.columns)
    # As the README does: Spark's Python workers have the environment of the JVM, which an earlier test module's
    # session may have started before this module set CHATEVAL_MODEL.
    env = {"CHATEVAL_MODEL": url, "CHATEVAL_CACHE_DIR": str(here / "cache")}
    for name in ("chateval-judge", "chateval-judge-searched"):
        uri = f"models:/{name}/1"
        expected = judged(uri, here, url)
        as_text = mlflow.pyfunc.spark_udf(spark, uri, result_type="string", env_manager="local", extra_env=env)
        as_struct = mlflow.pyfunc.spark_udf(spark, uri, result_type=RESULT_TYPE, env_manager="local",
                                              extra_env=env)
        rows = items.select("id", as_text(cols).alias("text"), as_struct(cols).alias("v")).collect()
        assert {r["id"]: r["text"] for r in rows} == expected and set(expected.values()) <= VERDICTS, name
        assert {r["id"]: r["v"]["verdict"] for r in rows} == expected, name
        for r in rows:
            v = r["v"].asDict()
            assert v["id"] == r["id"] and v["format"] == "pairwise" and v["error"] is None, v
            # the judge above already asked the same questions: these answers come from the LM cache (0 tokens)
            assert isinstance(v["prompt_tokens"], int) and json.loads(v["scores"]).keys() == {"answer_1", "answer_2"}, v
    # Without a result type, the model's signature gives the same struct.
    inferred = mlflow.pyfunc.spark_udf(spark, "models:/chateval-judge/1", env_manager="local", extra_env=env)
    rows = items.select("id", inferred(cols).alias("v")).collect()
    assert {r["id"]: r["v"]["verdict"] for r in rows} == judged("models:/chateval-judge/1", here, url)


@needs_spark
def test_positional_columns_are_named_from_the_signature(registered):
    """``udf(*df.columns)`` and ``udf("question", "answer_1", "answer_2")`` (MLflow's positional form) gave
    None for every row, exit 0: without input names in the signature, MLflow named the columns ``0``, ``1``, ... .
    Positional columns are now the task's inputs in order (then ``id``), as the signature declares them."""
    import mlflow

    here, url, spark, items = registered
    env = {"CHATEVAL_MODEL": url, "CHATEVAL_CACHE_DIR": str(here / "cache")}
    expected = judged("models:/chateval-judge/1", here, url)
    udf = mlflow.pyfunc.spark_udf(spark, "models:/chateval-judge/1", result_type="string", env_manager="local",
                                  extra_env=env)
    ordered = items.select("question", "answer_1", "answer_2", "id")  # spark.read.json sorts the columns by name
    every = ordered.select("id", udf(*ordered.columns).alias("verdict")).collect()
    three = items.select("id", udf("question", "answer_1", "answer_2").alias("verdict")).collect()
    assert {r["id"]: r["verdict"] for r in every} == expected and set(expected.values()) <= VERDICTS
    assert {r["id"]: r["verdict"] for r in three} == expected


def test_verdict_frame_puts_the_verdict_first_for_both_formats_and_invalid_rows():
    """Pairwise: the winner; pointwise: the scores' JSON text; an invalid row: no verdict, zero tokens (not NaN)."""
    import pandas as pd

    from chateval_dspy.deploy.saved.verdicts import RESULT_TYPE, VERDICT_COLUMNS, verdict_frame

    frame = pd.DataFrame([
        {"id": "a", "format": "pairwise", "winner": "2", "scores": '{"answer_1": 3, "answer_2": 8}',
         "prompt_tokens": 10, "completion_tokens": 2, "seconds": 0.5, "cost_usd": None, "consistent": True, "error": None},
        {"id": "b", "format": "pointwise", "winner": None, "scores": '{"overall": 4}', "prompt_tokens": 7,
         "completion_tokens": 1, "seconds": 0.2, "cost_usd": 0.001, "consistent": None, "error": None},
        {"id": "c", "error": "row 3: no field 'answer_2'"},
    ])
    out = verdict_frame(frame)
    names = [name for name, _ in VERDICT_COLUMNS]
    assert list(out.columns) == [*names, "consistent"] and RESULT_TYPE.startswith("verdict string, id string")
    assert list(out["verdict"]) == ["2", '{"overall": 4}', None]
    assert list(out["prompt_tokens"]) == [10, 7, 0] and str(out["prompt_tokens"].dtype) == "int64"
    assert out["cost_usd"].isna().tolist() == [True, False, True] and out["error"][2].startswith("row 3")


def test_the_wheel_is_packed_again_from_an_installed_distribution(tmp_path):
    """Not run from a checkout, the model's wheel is the installed files again (RECORD), less scripts and caches."""
    import subprocess
    import zipfile

    from optim.tracking.models import project_wheel

    built = project_wheel(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp_path / "site"),
                    str(built)], check=True)
    script = ("import sys, pathlib; from optim.tracking import models as m; assert m._checkout() is None, m.__file__; "
              "print(m.project_wheel(pathlib.Path(sys.argv[1])))")
    (tmp_path / "again").mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "again")], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 0, done.stderr[-2000:]
    again = Path(done.stdout.strip().splitlines()[-1])
    assert again.name == built.name
    with zipfile.ZipFile(built) as a, zipfile.ZipFile(again) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
        assert all(a.read(n) == b.read(n) for n in a.namelist() if not n.endswith("/RECORD"))
        assert b.testzip() is None
