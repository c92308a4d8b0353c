"""Locks on files: one writer per results file (``exclusive``), and a waiting lock for a one-time setup
(``waiting``), both ``flock`` on a lock file opened by ``open_lock_file``, which refuses a link, a pipe or another
file's second name instead of writing through it. A second run on a results file is refused, naming the holder's
pid, instead of judging every item again. ``flock`` is POSIX; without ``fcntl`` (Windows) nothing is locked.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from chateval_dspy.errors import ConfigError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (see the module docstring)
    fcntl = None


def refuse_link(path: str | Path, what: str = "results file") -> None:
    """A ``ConfigError`` if ``path`` is a symbolic link: a run writes (and ``--overwrite`` empties) its own files,
    never one that a link leads to.

    Example:
        >>> (tmp / "real.jsonl").touch(); (tmp / "link.jsonl").symlink_to(tmp / "real.jsonl")
        >>> refuse_link(tmp / "link.jsonl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: results file .../link.jsonl is a symbolic link; ...
    """
    if Path(path).is_symlink():
        raise ConfigError(f"{what} {path} is a symbolic link; refusing to write through it: give the file's own "
                          "path, or another one")


def lock_file(path: str | Path) -> Path:
    """The lock file of a results file: ``<file>.lock`` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


_held: dict[str, list] = {}  # lock file -> [fd, holding thread, depth]
_held_guard = threading.Lock()


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold the results file ``path`` for writing during the block: ``flock`` on ``lock_file(path)``, which holds
    this process's id while held and is removed on release. Re-entrant in the thread that holds it.

    Another process (or thread) holding it is a ``ConfigError`` naming its pid. A lock file left by a killed run
    holds no lock (the kernel releases a dead process's locks), so the next run takes it over.

    Example:
        >>> with exclusive(tmp / "r.jsonl"), exclusive(tmp / "r.jsonl"):
        ...     lock_file(tmp / "r.jsonl").read_text().strip() == str(os.getpid())
        True
        >>> lock_file(tmp / "r.jsonl").exists()
        False
    """
    if fcntl is None:
        yield
        return
    key = os.path.abspath(lock_file(path))
    with _held_guard:
        entry = _held.get(key)
        if entry is not None and entry[1] != threading.get_ident():
            raise ConfigError(f"{path} is being written by another thread of this process (pid {os.getpid()})")
        if entry is None:
            entry = _held[key] = [_lock(Path(key), path), threading.get_ident(), 0]
        entry[2] += 1
    try:
        yield
    finally:
        with _held_guard:
            entry[2] -= 1
            if entry[2] == 0:
                del _held[key]
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(key)  # while still locked: a run that opened this file meanwhile sees it went (_lock)
                os.close(entry[0])


def _lock(lock: Path, path) -> int:
    """A descriptor of ``lock`` locked by this process, with its pid written in; a ``ConfigError`` naming the
    holder when another process holds it, or when ``lock`` is not a file of its own (``_own_lock_file``)."""
    while True:
        fd = open_lock_file(lock, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = lock_holder(fd, lock)
            os.close(fd)
            raise ConfigError(f"{path} is being written by another run ({who}): wait for it to finish or stop it, or "
                              "choose another output file") from None
        except BaseException:
            os.close(fd)
            raise
        # The last holder removes the file as it lets go; a lock on a file that is gone keeps nobody out.
        try:
            here = os.stat(lock, follow_symlinks=False)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev) and mine.st_nlink == 1:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def open_lock_file(lock: Path, path) -> int:
    """A read-write descriptor of ``lock`` (created if missing) for locking ``path``; a ``ConfigError`` naming both
    unless it is a regular file with no other name: the pid is written into a lock file, so a link, a hard link to
    another file (which writing would overwrite), a pipe or a device is refused, not written."""
    try:
        # O_NONBLOCK: a named pipe put in the lock file's place must not block the open (it is refused next).
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot lock {path} ({lock}: {exc.strerror or exc}): remove {lock} if it is a link or "
                          "not a regular file") from exc
    st = os.fstat(fd)
    problem = ("is not a regular file (a named pipe, a device or a folder)" if not stat.S_ISREG(st.st_mode) else
               f"has {st.st_nlink} names (a hard link to another file, which locking would overwrite)"
               if st.st_nlink > 1 else None)
    if problem:
        os.close(fd)
        raise ConfigError(f"cannot lock {path}: {lock} {problem}: remove it")
    return fd


@contextlib.contextmanager
def waiting(lock: Path, what) -> Iterator[None]:
    """Hold ``flock`` on ``lock`` during the block, waiting for another holder to let go; the file stays (unlinking
    a locked file would let a third process lock a new inode while the second holds the old)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = open_lock_file(lock, what)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def lock_holder(fd: int, lock: Path) -> str:
    """Who holds the ``flock`` on ``fd``'s file, as the kernel says (``/proc/locks``, Linux): ``"pid N"``. Elsewhere,
    or where the kernel names no process this one can see, the pid the lock file claims, said to be unconfirmed
    (anyone who can write the file can write any number in it)."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            for line in table:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; waiters are listed as "1: -> FLOCK ...".
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit() \
                        and fields[4] != "0":
                    return f"pid {fields[4]}"
    except OSError:
        pass
    claim = os.pread(fd, 40, 0).decode("ascii", "replace").strip()
    said = f"its lock file {lock} says pid {claim}" if claim.isdigit() else f"lock file {lock}"
    return f"a process the system does not name; {said}, unconfirmed"
