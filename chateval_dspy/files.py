"""Files written so that a kill leaves the old file or the new one, never half of it; files opened as what they
claim to be (``open_regular``)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from chateval_dspy.errors import ConfigError


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: a temporary file in the same folder, fsynced, then renamed over it.

    Example:
        >>> write_atomic(tmp / "a.txt", b"whole"); (tmp / "a.txt").read_bytes()
        b'whole'
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # 0o666 less the umask, not mkstemp's owner-only mode: a reader may run as another user (an engine's batch).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Sync a folder, so that a rename in it is durable (POSIX); elsewhere a no-op."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def open_regular(path: str | Path, flags: int, what: str, *, sole: bool = False) -> int:
    """A file descriptor on the regular file ``path`` opened with ``flags``, never following a symbolic link nor
    blocking on a pipe or device. ``sole`` also refuses a file with other hard links (one this program writes must
    be its own). ``FileNotFoundError`` when missing (and not created); else a ``ConfigError`` naming ``what``.

    Example:
        >>> _ = (tmp / "real").write_text("x"); (tmp / "link").symlink_to(tmp / "real")
        >>> open_regular(tmp / "link", os.O_RDONLY, "batch file")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: batch file .../link is a symbolic link; refusing to follow it: ...
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{what} {path} is a symbolic link; refusing to follow it: put the file itself there"
                              ) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a pipe nobody reads, a folder
            raise ConfigError(f"{what} {path} is not a regular file") from None
        raise ConfigError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    problem = ("is not a regular file (a named pipe, a device or a folder)" if not stat.S_ISREG(info.st_mode)
               else f"has {info.st_nlink} hard links; refusing to write a file that is also elsewhere"
               if sole and info.st_nlink != 1 else None)
    if problem:
        os.close(fd)
        raise ConfigError(f"{what} {path} {problem}")
    return fd
