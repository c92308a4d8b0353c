"""A saved evaluator fetched from MLflow: a run's ``evaluator/`` artifact (``runs:/<run_id>[/path]``, or
``runs:/<run_id>/pyfunc`` for the pyfunc model, whose artifacts hold the evaluator directory) or a registered model
(``models:/<name>/<version>``, ``models:/<name>/latest``, ``models:/<name>@<alias>``).

The plain JSON evaluator is preferred wherever one exists; a dspy-flavour model is a pickle, loaded only when
trusted (``pickled``). Every fault of a tracking or artifact store is a ``ConfigError`` naming the URI.
"""

from __future__ import annotations

import logging
from pathlib import Path

import chateval_dspy.limits as limits
from chateval_dspy.deploy.saved.cascade import CASCADE_FILE
from chateval_dspy.deploy.saved.pickled import unpickle_model
from chateval_dspy.deploy.saved.store import CARD_FILE
from chateval_dspy.errors import ChatEvalError, ConfigError
from chateval_dspy.program.chateval import ChatEval

log = logging.getLogger(__name__)

MLFLOW_SCHEMES = ("runs:/", "models:/")
MODEL_URIS = "use models:/<name>/<version>, models:/<name>/latest or models:/<name>@<alias>"


def from_mlflow(uri: str, workdir: Path, trust_pickle: bool) -> Path | ChatEval:
    """A local evaluator directory for an MLflow URI, downloaded into ``workdir``, or (trusted only) the unpickled
    dspy model."""
    try:
        return _fetch(uri, workdir, trust_pickle)
    except ChatEvalError:
        raise
    except Exception as exc:  # MlflowException, and whatever a tracking or artifact store raises
        raise ConfigError(f"cannot load {uri} from MLflow ({type(exc).__name__}: {str(exc)[:300]})") from exc


def _fetch(uri: str, workdir: Path, trust_pickle: bool) -> Path | ChatEval:
    import mlflow  # only this branch needs MLflow

    def download(artifact_uri: str, into: str) -> Path:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri, dst_path=str(workdir / into)))

    if uri.startswith("models:/"):
        run_id, model_uri = _registered_model(uri)
        if run_id:
            try:  # the run that logged the model also logged the evaluator as plain JSON: prefer it
                return download(f"runs:/{run_id}/evaluator", "run")
            except Exception:  # noqa: BLE001 - no evaluator in that run: the model's own artifacts may hold one
                log.info("run %s has no 'evaluator/' artifact; reading the model %s itself", run_id, model_uri)
        return _evaluator_in(download(model_uri, "model"), model_uri, trust_pickle)
    run_id, _, sub = uri[len("runs:/"):].partition("/")
    sub = sub.strip("/") or "evaluator"
    if not run_id:
        raise ConfigError(f"{uri}: use runs:/<run_id>[/<artifact path>]")
    try:
        local = download(f"runs:/{run_id}/{sub}", "run")
    except Exception as exc:
        if sub == "evaluator":
            raise ConfigError(f"run {run_id} has no saved evaluator (artifact 'evaluator/'): {str(exc)[:300]}") from exc
        raise ConfigError(f"cannot fetch {uri}: {str(exc)[:300]}") from exc
    return _evaluator_in(local, uri, trust_pickle)


def _registered_model(uri: str) -> tuple[str | None, str]:
    """``(run_id, models:/<name>/<version>)`` for ``models:/<name>/<version|latest>`` or ``models:/<name>@<alias>``;
    ``(None, uri)`` for a logged model's own URI (``models:/<model_id>``), which has no registry entry."""
    import mlflow

    rest = uri[len("models:/"):].strip("/")
    client = mlflow.MlflowClient()
    if "/" in rest:
        name, version = rest.split("/", 1)
        if not name or not version or "/" in version:
            raise ConfigError(f"{uri}: {MODEL_URIS}")
        if version.lower() == "latest":
            if "'" in name:
                raise ConfigError(f"{uri}: a model name with a quote cannot be looked up")
            found = client.search_model_versions(f"name='{name}'")
            if not found:
                raise ConfigError(f"{uri}: registered model {name!r} has no versions")
            mv = max(found, key=lambda v: int(v.version))
        else:
            mv = client.get_model_version(name, version)
    elif "@" in rest:
        name, alias = rest.split("@", 1)
        mv = client.get_model_version_by_alias(name, alias)
    elif rest:
        return None, uri
    else:
        raise ConfigError(f"{uri}: {MODEL_URIS}")
    return mv.run_id, f"models:/{mv.name}/{mv.version}"


def _evaluator_in(local: Path, uri: str, trust_pickle: bool) -> Path | ChatEval:
    """The evaluator directory inside downloaded MLflow artifacts: the directory itself, the JSON evaluator
    a pyfunc model carries as its ``evaluator`` artifact (read, never run), or else a pickled dspy model."""
    if (local / CARD_FILE).is_file() or (local / CASCADE_FILE).is_file():  # an evaluator, or a cascade (load checks it)
        return local
    mlmodel = local / "MLmodel"
    if not mlmodel.is_file():
        raise ConfigError(f"{uri} holds neither a saved evaluator ({CARD_FILE}) nor an MLflow model")
    text = limits.read_bounded(mlmodel, limits.MAX_MLMODEL_FILE_BYTES, "limits.MAX_MLMODEL_FILE_BYTES", "MLmodel file")
    try:  # the bounded loader: the MLmodel file comes from an artifact store, as untrusted as any file
        flavors = (limits.parse_yaml(text if isinstance(text, str) else text.decode("utf-8", "replace"),
                                     f"{uri} MLmodel") or {}).get("flavors") or {}
        relative = flavors["python_function"]["artifacts"]["evaluator"]["path"]
    except (ConfigError, AttributeError, KeyError, TypeError):
        relative = None
    if isinstance(relative, str):
        inside = (local / relative).resolve()
        # the MLmodel file is data from the artifact store: it must not point outside the download
        saved = (inside / CARD_FILE).is_file() or (inside / CASCADE_FILE).is_file()
        if inside.is_relative_to(local.resolve()) and saved:
            return inside
        raise ConfigError(f"{uri}: the pyfunc model's 'evaluator' artifact ({relative[:200]!r}) is not a saved "
                          "evaluator inside the model")
    if isinstance(flavors, dict) and "dspy" in flavors:
        return unpickle_model(uri, trust_pickle)
    raise ConfigError(f"{uri} is an MLflow model but not a chateval-dspy evaluator (flavors: "
                      f"{', '.join(map(str, flavors)) if isinstance(flavors, dict) else '?'})")

