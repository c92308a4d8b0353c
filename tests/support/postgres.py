"""A real PostgreSQL 16 server for tests: the ``pgserver`` wheel's binaries, a throwaway cluster, loopback, trust auth.

Import the fixture into a test module: ``from postgres import postgres  # noqa: F401``. The server refuses to run
as root, so when the tests run as root the server runs as ``nobody``, from a copy of the binaries inside the
cluster's folder (the venv may sit under a folder, such as /root, that ``nobody`` cannot enter).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from local_http import free_port

_SPEC = importlib.util.find_spec("pgserver")  # found, not imported: only its files are used
PG_HOME = Path(_SPEC.origin).parent / "pginstall" if _SPEC and _SPEC.origin else None
PG_BIN = PG_HOME / "bin" if PG_HOME else None  # the client programs (createdb) run from here, as any user
ROLE = "postgres"  # the database superuser, whichever OS user runs the server
RUN_AS = "nobody"  # the OS user that runs the server when the tests run as root: one that every Linux has


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", RUN_AS, "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr[-2000:] or done.stdout[-2000:]}")


def missing() -> str | None:
    """Why no server can start here, or None."""
    if PG_BIN is None or not (PG_BIN / "pg_ctl").exists():
        return 'PostgreSQL\'s binaries are not installed: pip install -e ".[dev]" (the pgserver wheel ships them)'
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


@dataclass
class PostgresServer:
    """A running cluster: ``url(db)`` names a database, ``fresh()`` creates an empty one and returns its URL.

    ``server_bin`` holds the server programs (``initdb``, ``pg_ctl``, ``postgres``) the cluster runs from.
    """

    root: Path
    port: int
    server_bin: Path
    _names: itertools.count = field(default_factory=itertools.count)

    def url(self, db: str = "postgres", password: str | None = None) -> str:
        # Trust auth ignores any password: a test may pass one to check that it is never printed.
        auth = f"{ROLE}:{password}" if password else ROLE
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{db}"

    def fresh(self, prefix: str = "db", password: str | None = None) -> str:
        name = f"{prefix}_{next(self._names)}"
        _run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", ROLE, name], f"createdb {name}")
        return self.url(name, password)

    def start(self) -> None:
        data = self.root / "data"
        _run(_as_server_user([str(self.server_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", ROLE,
                              "--no-sync"]), "initdb")
        # fsync off: a test cluster is thrown away, and fsyncs cost seconds on a shared disk.
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        _run(_as_server_user([str(self.server_bin / "pg_ctl"), "-D", str(data), "-o", opts, "-l",
                              str(self.root / "server.log"), "-w", "-t", "60", "start"]), "pg_ctl start")

    def stop(self) -> None:
        subprocess.run(_as_server_user([str(self.server_bin / "pg_ctl"), "-D", str(self.root / "data"), "-m",
                                        "immediate", "-w", "stop"]), capture_output=True, timeout=60)


def _server_bin(root: Path) -> Path:
    """Where the server programs run from: the wheel's folder, or as root a copy in ``root`` that ``nobody`` reads."""
    if os.geteuid() != 0:
        return PG_BIN
    # The programs find lib/ and share/ relative to themselves, and libpq in the wheel's pgserver.libs beside the
    # package (RPATH $ORIGIN/../../../pgserver.libs): the copy keeps the site-packages layout.
    site = PG_HOME.parent.parent
    shutil.copytree(PG_HOME, root / "pgserver" / "pginstall", ignore=shutil.ignore_patterns("include", "*.a"))
    shutil.copytree(site / "pgserver.libs", root / "pgserver.libs")
    shutil.chown(root, RUN_AS)
    return root / "pgserver" / "pginstall" / "bin"


def start_server() -> PostgresServer:
    """A new cluster in a temporary folder that the server's user owns (pytest's own folders are mode 0700)."""
    root = Path(tempfile.mkdtemp(prefix="chateval-pg-"))
    try:
        server = PostgresServer(root, free_port(), _server_bin(root))
        server.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return server


@pytest.fixture(scope="module")
def postgres():
    """A running ``PostgresServer`` for the module; stopped and deleted at teardown."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    server = start_server()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
