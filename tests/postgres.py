"""A real PostgreSQL 15 server for tests (issue 24): Debian's binaries, a throwaway cluster, loopback, trust auth.

Import the fixture into a test module: ``from postgres import postgres  # noqa: F401``. The server refuses to run
as root, so when the tests run as root, every server command runs as the ``postgres`` user (``runuser``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("CHATEVAL_PG_BIN", "/usr/lib/postgresql/15/bin"))
OWNER = "postgres"  # the OS user that owns the cluster when we run as root (Debian's package creates it)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", OWNER, "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(_as_owner(argv), capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr[-2000:] or done.stdout[-2000:]}")


def missing() -> str | None:
    """Why no server can start here, or None."""
    if not (PG_BIN / "pg_ctl").exists():
        return f"PostgreSQL is not installed ({PG_BIN / 'pg_ctl'} is absent; Debian: apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


@dataclass
class PostgresServer:
    """A running cluster: ``url(db)`` names a database, ``fresh()`` creates an empty one and returns its URL."""

    root: Path
    port: int
    _names: itertools.count = field(default_factory=itertools.count)

    def url(self, db: str = "postgres", password: str | None = None) -> str:
        # Trust auth ignores any password: a test may pass one to check that it is never printed.
        auth = f"{OWNER}:{password}" if password else OWNER
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{db}"

    def fresh(self, prefix: str = "db", password: str | None = None) -> str:
        name = f"{prefix}_{next(self._names)}"
        _run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", OWNER, name], f"createdb {name}")
        return self.url(name, password)

    def start(self) -> None:
        data = self.root / "data"
        _run([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", OWNER, "--no-sync"], "initdb")
        # fsync off: a test cluster is thrown away, and fsyncs cost seconds on a shared disk.
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        _run([str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(self.root / "server.log"), "-w",
              "-t", "60", "start"], "pg_ctl start")

    def stop(self) -> None:
        subprocess.run(_as_owner([str(PG_BIN / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "-w",
                                  "stop"]), capture_output=True, timeout=60)


def start_server() -> PostgresServer:
    """A new cluster in a temporary folder the ``postgres`` user owns (pytest's own folders are root's, mode 0700)."""
    root = Path(tempfile.mkdtemp(prefix="chateval-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, OWNER, OWNER)
    server = PostgresServer(root, _free_port())
    try:
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
