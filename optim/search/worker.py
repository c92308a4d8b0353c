"""Which process holds a trial, a claim or an MLflow run, and whether that process is still alive.

A killed worker leaves its trial and MLflow run RUNNING, and Optuna's heartbeat notices only after minutes; a rerun
on the same host can ask the operating system at once. The start time recorded beside the pid keeps a reused pid from
passing for the old process. A worker on another host is presumed alive (heartbeats cover it).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks since boot)`` from ``/proc/<pid>/stat``; None where unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = text.rpartition(")")[2].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Worker:
    """A process on a host, recorded as ``host:pid:started`` (``started`` is absent where ``/proc`` is not).

    Example:
        >>> me = Worker.current()
        >>> Worker.parse(me.tag()) == me, me.is_dead()
        (True, False)
    """

    host: str
    pid: int
    started: int | None = None

    @classmethod
    def current(cls) -> Worker:
        stat = _stat(os.getpid())
        return cls(socket.gethostname(), os.getpid(), stat[1] if stat else None)

    def tag(self) -> str:
        return f"{self.host}:{self.pid}" + (f":{self.started}" if self.started is not None else "")

    @classmethod
    def parse(cls, text) -> Worker | None:
        """The worker a tag names, or None for anything else (a tag written by an older version, say)."""
        if not isinstance(text, str):
            return None
        parts = text.rsplit(":", 2)
        try:
            if len(parts) == 3 and parts[1].isdigit():
                return cls(parts[0], int(parts[1]), int(parts[2]))
            host, pid = text.rsplit(":", 1)
            return cls(host, int(pid))
        except ValueError:
            return None

    def is_dead(self) -> bool:
        """True only when this host can tell for sure that the process has ended."""
        if self.host != socket.gethostname():
            return False
        stat = _stat(self.pid)
        if stat is not None:
            state, started = stat
            # A zombie has ended (only its exit status waits for its parent); another start time is another process.
            return state == "Z" or (self.started is not None and started != self.started)
        if _stat(os.getpid()) is not None:  # /proc works here, and has no entry for this pid
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # someone else's live process
            return False
        return False


def dead(tag) -> bool:
    """Whether the worker named by ``tag`` has certainly ended (False for an unreadable tag)."""
    worker = Worker.parse(tag)
    return worker is not None and worker.is_dead()
