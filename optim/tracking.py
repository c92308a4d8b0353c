"""MLflow, and nothing else here imports it.

Default store: ``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/`` in the
working directory; ``--tracking-uri`` or ``MLFLOW_TRACKING_URI`` choose another.
Params are the run's ``DebateConfig`` plus model, data and split: no secret has a way in,
and ``assert_no_secrets`` double-checks every text before it is logged.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path

from chateval_dspy.lm.offline import ensure_offline
from chateval_dspy.run.metrics import Estimate

ensure_offline()
# MLflow draws a progress bar for every artifact it reads back (DSPy autolog does, per optimizer step),
# which interleaves with the command's own progress.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import mlflow  # noqa: E402

from chateval_dspy.errors import SecretError  # noqa: E402

DEFAULT_DIR = "mlruns"
EXPERIMENT = "chateval-dspy"
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.I)


def tracking_uri(uri: str | None = None) -> str:
    """The URI in force: the argument, ``MLFLOW_TRACKING_URI``, or the local sqlite store under ``mlruns/``."""
    if uri:
        return uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    Path(DEFAULT_DIR).mkdir(exist_ok=True)
    return f"sqlite:///{Path(DEFAULT_DIR).resolve() / 'mlflow.db'}"


def setup(uri: str | None = None, experiment: str = EXPERIMENT) -> str:
    """Point MLflow at the store and experiment; artifacts of the local store live under ``mlruns/``."""
    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)  # with the sqlite store, artifacts land in ./mlruns/<experiment>/<run>
    return uri


def secrets_in_environment() -> list[str]:
    """Values of environment variables that look like credentials (long enough to be one)."""
    return [v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 8]


def assert_no_secrets(text: str, where: str) -> None:
    for secret in secrets_in_environment():
        if secret in text:
            raise SecretError(f"refusing to log {where}: it contains the value of a credential variable "
                              "(a key or token from the environment); nothing was logged")


def _flat(params: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return out


@contextlib.contextmanager
def run(name: str, *, params: dict, tags: dict | None = None, nested: bool = False,
        uri: str | None = None) -> Iterator[mlflow.ActiveRun]:
    """An MLflow run holding ``params`` (flattened) and ``tags``; nested under the active run if asked."""
    if not nested:
        setup(uri)
    assert_no_secrets(repr(tags), "tags")
    with mlflow.start_run(run_name=name, nested=nested, tags=tags) as active:
        log_params(params)
        yield active


def metric_values(metrics: dict, cost: dict | None = None, prefix: str = "") -> dict[str, float]:
    """Estimates become value + CI bounds; NaN figures are left out (MLflow stores no NaN meaningfully)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Estimate):
            d = value.to_dict()
            out.update({f"{prefix}{key}": d["value"], f"{prefix}{key}_ci_low": d["ci_low"], f"{prefix}{key}_ci_high": d["ci_high"]})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    for key, value in (cost or {}).items():
        if isinstance(value, (int, float)):
            out[f"{prefix}{key}"] = float(value)
    return {k: v for k, v in out.items() if not math.isnan(v)}


def log_params(params: dict) -> None:
    flat = _flat(params)
    assert_no_secrets(repr(flat), "params")
    mlflow.log_params(flat)


def log_metrics(metrics: dict, cost: dict | None = None, prefix: str = "", step: int | None = None) -> None:
    mlflow.log_metrics(metric_values(metrics, cost, prefix), step=step)


def log_file(path: str | Path, artifact_dir: str | None = None) -> None:
    path = Path(path)
    if path.is_dir():
        for f in path.rglob("*"):
            if f.is_file():
                assert_no_secrets(f.read_text(encoding="utf-8", errors="replace"), str(f))
        mlflow.log_artifacts(str(path), artifact_dir)
    else:
        assert_no_secrets(path.read_text(encoding="utf-8", errors="replace"), str(path))
        mlflow.log_artifact(str(path), artifact_dir)


def log_pyfunc_model(evaluator_dir: str | Path, name: str = "pyfunc", registered_name: str | None = None):
    """The saved evaluator as a pyfunc model logged as code (``optim/pyfunc_model.py``): no pickle,
    servable with ``mlflow models serve`` and usable as ``mlflow.pyfunc.spark_udf``."""
    import chateval_dspy

    code = Path(__file__).with_name("pyfunc_model.py")
    return mlflow.pyfunc.log_model(
        name=name, python_model=str(code), artifacts={"evaluator": str(evaluator_dir)},
        registered_model_name=registered_name, pip_requirements=["chateval-dspy"],
        code_paths=[str(Path(chateval_dspy.__file__).parent)],
    )


def log_dspy_model(program, name: str = "evaluator", registered_name: str | None = None):
    """The program as an MLflow model (dspy flavor), optionally registered.

    The flavor also saves DSPy's settings; they are emptied of the LM first, so that no
    client, endpoint or key travels with the model. Production binds the LM at load time.
    """
    import dspy

    with dspy.context(lm=None, adapter=None, trace=[]):
        return mlflow.dspy.log_model(
            program, name=name, registered_model_name=registered_name, use_dspy_model_save=True,
            pip_requirements=[f"dspy=={dspy.__version__}", "chateval-dspy"],
        )


def autolog_compiles() -> None:
    """Record the optimizer's progress (child runs per evaluation) without a trace per LM call."""
    mlflow.dspy.autolog(log_traces=False, log_traces_from_compile=False, log_traces_from_eval=False,
                        log_compiles=True, log_evals=True, silent=True)
