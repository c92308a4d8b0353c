"""The saved evaluator as MLflow models: a batch-capable pyfunc (registered; serving and Spark) and the dspy flavour.

The pyfunc is logged as code (``chateval_dspy/deploy/pyfunc.py``, no pickle) with two artifacts: ``evaluator``
(the saved evaluator directory, which ``chateval_dspy.load("models:/...")`` also reads) and ``wheel`` (this project's own
wheel). Its requirements are the wheel's runtime dependencies pinned to the versions installed here, plus the
wheel itself by its path inside the model, so ``spark_udf(..., env_manager="uv")`` rebuilds the environment on
a node from the model alone and PyPI. The wheel is the only copy of the package the model carries.

Each prediction row is a verdict whose first column is ``verdict`` (what ``result_type="string"`` returns):
pairwise, the winner (``"1"``, ``"2"``, ``"tie"``); pointwise, the criteria's scores as JSON text
(``{"overall": 4}``); None when every referee abstained or the row was invalid (see ``error``).
The columns and ``RESULT_TYPE``, the Spark DDL of their struct, are ``chateval_dspy.deploy.verdicts``'.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from chateval_dspy import deploy
from chateval_dspy.deploy.verdicts import VERDICT_COLUMNS
from chateval_dspy.errors import ConfigError

DIST = "chateval-dspy"
PYFUNC_CODE = Path(deploy.__file__).with_name("pyfunc.py")  # by path: importing it would set MLflow's model
SOURCES = ("pyproject.toml", "README.md", "chateval_dspy", "optim")  # what the wheel is built from
_BUILT: dict[str, Path] = {}  # source fingerprint -> the wheel built from it in this process


def signature():
    """The pyfunc's output columns (``spark_udf`` without ``result_type`` returns the struct) and its one
    parameter, ``concurrency`` (items judged at once per batch). Inputs are not declared: they are the task's
    fields, whatever the evaluator's format."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(inputs=None, outputs=Schema([ColSpec(kind, name) for name, kind in VERDICT_COLUMNS]),
                          params=ParamSchema([ParamSpec("concurrency", "long", 2)]))


def _checkout() -> Path | None:
    """The source tree this package runs from, if it is a checkout of this project (else None)."""
    import chateval_dspy

    root = Path(chateval_dspy.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'^name\s*=\s*"chateval-dspy"', pyproject.read_text(encoding="utf-8"), re.M):
        return root
    return None


def _wheel_from_checkout(root: Path, into: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the source tree: the build leaves nothing (build/, egg-info) in it."""
    src = into / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        path = root / name
        (shutil.copytree(path, src / name, ignore=skip) if path.is_dir() else shutil.copy2(path, src / name))
    # The wheel's METADATA would carry the whole README as its description, example values of credential variables
    # included, which the secret check rightly refuses to log: a model's wheel needs no manual.
    (src / "README.md").write_text(f"{DIST}: the evaluator's runtime, packed with a logged model.\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(into / "dist"), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted((into / "dist").glob("chateval_dspy-*.whl"))
    if done.returncode or not wheels:
        raise ConfigError(f"building the project's wheel from {root} failed ({' '.join(cmd[1:4])}): "
                          f"{(done.stderr or done.stdout)[-800:]}")
    return wheels[0]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel_from_installed(into: Path) -> Path:
    """The installed distribution packed again as a wheel, from its RECORD (the files pip installed); console
    scripts and installer marks are left out, and RECORD is written anew."""
    from importlib import metadata

    dist = metadata.distribution(DIST)
    info = next((f for f in dist.files or [] if f.name == "WHEEL" and f.parent.name.endswith(".dist-info")), None)
    if info is None:
        raise ConfigError(f"{DIST} {dist.version} is installed without a wheel's RECORD (not from a wheel, not a "
                          "checkout): install it from a wheel to log the pyfunc model")
    tags = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("Tag:")]
    wheel = into / f"chateval_dspy-{dist.version}-{tags[0] if tags else 'py3-none-any'}.whl"
    dist_info, rows = str(info.parent), []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files:
            name = f.as_posix()
            if (name.startswith("..") or "__pycache__" in name or name.endswith(".pyc")
                    or name in {f"{dist_info}/{x}" for x in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")}):
                continue
            data = Path(f.locate()).read_bytes()
            zf.writestr(name, data)
            rows.append(f"{name},{_record_hash(data)},{len(data)}")
        zf.writestr(f"{dist_info}/RECORD", "\n".join([*rows, f"{dist_info}/RECORD,,"]) + "\n")
    return wheel


def _fingerprint(root: Path) -> str:
    """The sources a wheel is built from, as (path, size, mtime) of each file: any edit changes it."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = root / name
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc" and ".egg-info" not in str(f):
                stat = f.stat()
                digest.update(f"{f.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def project_wheel(into: Path) -> Path:
    """This project's wheel, built under ``into``: from the checkout it runs from, else from the installed files.

    A checkout's wheel is built once per process and source state (a build takes seconds; a test session or a
    notebook logs many models), then copied."""
    root = _checkout()
    if root is None:
        return _wheel_from_installed(into)
    key = _fingerprint(root)
    if key not in _BUILT or not _BUILT[key].is_file():
        folder = tempfile.mkdtemp(prefix="chateval-wheel-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _BUILT[key] = _wheel_from_checkout(root, Path(folder))
    return Path(shutil.copy2(_BUILT[key], into / _BUILT[key].name))


def pinned_requirements(wheel: Path) -> list[str]:
    """The wheel's runtime dependencies (its ``Requires-Dist`` that apply here, extras left out), each pinned to
    the version installed in this environment: the model's environment is the one it was tested in."""
    from email.parser import Parser
    from importlib import metadata

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode("utf-8"))
    pins = []
    for text in meta.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            raise ConfigError(f"{DIST} needs {req} but it is not installed here; install it before logging the "
                              "model, whose requirements pin what is installed") from None
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        pins.append(f"{req.name}{extras}=={version}")
    return pins


def _refuse_secrets(wheel: Path, evaluator_dir: Path) -> None:
    """Neither the wheel's files (a key pasted into the source tree) nor the evaluator's may hold a secret."""
    from optim.tracking.runs import assert_no_secrets

    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            assert_no_secrets(zf.read(name).decode("utf-8", "replace"), f"{wheel.name}:{name}")
    for f in evaluator_dir.rglob("*"):
        if f.is_file():
            assert_no_secrets(f.read_text(encoding="utf-8", errors="replace"), str(f))


def log_pyfunc_model(evaluator_dir: str | Path, name: str = "pyfunc", registered_name: str | None = None):
    """The saved evaluator as the pyfunc model (``chateval_dspy/deploy/pyfunc.py``, logged as code), with the project's
    wheel and pinned requirements; registered as ``registered_name`` when given. Returns MLflow's ModelInfo."""
    import mlflow

    with tempfile.TemporaryDirectory(prefix="chateval-wheel-") as tmp:
        wheel = project_wheel(Path(tmp))
        _refuse_secrets(wheel, Path(evaluator_dir))
        # MLflow stores an artifact under artifacts/<its file name> and installs requirements from a copy of
        # the model directory, so the wheel's path is relative to the model.
        requirements = [*pinned_requirements(wheel), f"artifacts/{wheel.name}"]
        return mlflow.pyfunc.log_model(
            name=name, python_model=str(PYFUNC_CODE), artifacts={"evaluator": str(evaluator_dir), "wheel": str(wheel)},
            registered_model_name=registered_name, pip_requirements=requirements, signature=signature(),
        )


def log_dspy_model(program, name: str = "evaluator"):
    """The program as an MLflow model (dspy flavour), not registered: Spark refuses it (no batch inference).

    The flavour also saves DSPy's settings; they are emptied of the LM first, so that no
    client, endpoint or key travels with the model. Production binds the LM at load time. Its pickle needs
    chateval-dspy installed where it loads; no registry holds that name, so it is not a requirement here (one
    that pip would look up on PyPI): the pyfunc, with the wheel, is the model that rebuilds its environment.
    """
    import dspy
    import mlflow

    with dspy.context(lm=None, adapter=None, trace=[]):
        return mlflow.dspy.log_model(
            program, name=name, use_dspy_model_save=True,
            pip_requirements=[f"dspy=={dspy.__version__}"],
        )


def log_models(program, evaluator_dir: str | Path, registered_name: str | None = None):
    """Both models of a saved program, in the active run: the dspy flavour (``evaluator``) and the pyfunc
    (``pyfunc``), the one registered as ``registered_name``. Call it outside any LM context (none travels)."""
    log_dspy_model(program)
    return log_pyfunc_model(evaluator_dir, registered_name=registered_name)
