"""Shared stores (Optuna's RDB storage, MLflow's tracking database) created once, however many workers start together.

Both libraries create their tables on first use, and neither guards that against another process doing the same:
two workers started at once on a fresh SQLite file or PostgreSQL database both run the migrations, and the loser
crashes (Optuna: a duplicate table; MLflow: ``_alembic_tmp_experiments already exists`` on SQLite, a duplicate
key on PostgreSQL). ``init_lock`` serialises that first use: ``run.locks.waiting`` on a file next to a SQLite database
(every process that opens it shares its filesystem), a PostgreSQL advisory lock held on a connection of its own
(workers on any host). The second worker in finds the tables made and goes on. Other URLs (an MLflow server over
HTTP creates its store once, at start) need no lock.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

from chateval_dspy.errors import ConfigError
from chateval_dspy.run.locks import waiting


def _parse(url: str):
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"not a database URL: {redact_url(url)} ({type(exc).__name__})") from None


def backend(url: str) -> str | None:
    """``"sqlite"``, ``"postgresql"``, ``"mysql"``, ...: the database behind a SQLAlchemy URL; None for anything else.

    Example:
        >>> backend("postgresql://u:pw@db:5432/optuna"), backend("sqlite:///mlruns/optuna.db"), backend("http://h:5000")
        ('postgresql', 'sqlite', None)
    """
    if "://" not in url or url.split("://", 1)[0].split("+", 1)[0] not in ("sqlite", "postgresql", "postgres", "mysql",
                                                                          "mssql", "oracle"):
        return None
    return _parse(url).get_backend_name()


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for an in-memory database or another backend."""
    if backend(url) != "sqlite":
        return None
    database = _parse(url).database
    return Path(database) if database and database != ":memory:" else None


def redact_url(url: str) -> str:
    """A storage or tracking URL fit to print and log: any password is masked.

    Example:
        >>> redact_url("postgresql://optuna:s3cret@db.internal:5432/optuna")
        'postgresql://optuna:***@db.internal:5432/optuna'
    """
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # an unparsable netloc (a bad port): keep nothing after the scheme's user part
        return url.split("://", 1)[0] + "://***"
    if password:
        userinfo, _, host = parts.netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    return url


@contextlib.contextmanager
def _advisory_lock(url: str, purpose: str) -> Iterator[None]:
    """``pg_advisory_lock`` on a connection of its own (closing it releases the lock, should this process die)."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    # A signed 64-bit key per purpose: Optuna and MLflow stores in one database lock apart.
    key = {"k": int.from_bytes(hashlib.sha256(f"chateval-dspy:{purpose}".encode()).digest()[:8], "big", signed=True)}
    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), key)
            conn.commit()  # the lock is the session's, not the transaction's: no transaction stays open meanwhile
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), key)
                conn.commit()
    finally:
        engine.dispose()


@contextlib.contextmanager
def init_lock(url: str, purpose: str) -> Iterator[None]:
    """Hold the lock that creating ``url``'s ``purpose`` tables (``"optuna"``, ``"mlflow"``) needs; nothing to hold
    for a URL that is not a SQLite file or PostgreSQL database."""
    db = sqlite_path(url)
    if db is not None:
        with waiting(db.with_name(db.name + ".init.lock"), db):
            yield
    elif backend(url) == "postgresql":
        with _advisory_lock(url, purpose):
            yield
    else:
        yield
