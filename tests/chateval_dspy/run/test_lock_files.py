"""Lock files: a lock file is the run's own regular file, or it is refused; the refusal names the
process that holds the lock, as the kernel says, not whatever pid the file claims."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from chateval_dspy.errors import ConfigError
from chateval_dspy.run.locks import exclusive, lock_file

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX locks, links and named pipes")


def test_a_lock_file_hard_linked_to_another_file_is_refused_and_that_file_kept(tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me\n")
    os.link(victim, lock_file(tmp_path / "r.jsonl"))
    with pytest.raises(ConfigError, match=r"r\.jsonl\.lock has 2 names \(a hard link"):
        with exclusive(tmp_path / "r.jsonl"):
            pass
    assert victim.read_text() == "keep me\n"


def test_a_named_pipe_as_lock_file_is_a_clear_error(tmp_path):
    os.mkfifo(lock_file(tmp_path / "r.jsonl"))
    with pytest.raises(ConfigError, match=r"r\.jsonl\.lock is not a regular file \(a named pipe"):
        with exclusive(tmp_path / "r.jsonl"):
            pass


HOLDER = textwrap.dedent("""
    import sys
    from chateval_dspy.run.locks import exclusive
    with exclusive(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()
""")


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="the kernel's lock table (Linux)")
def test_the_refusal_names_the_process_that_holds_the_lock_not_the_pid_in_the_file(tmp_path):
    results = tmp_path / "r.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(results)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(lock_file(results), "r+") as claim:  # anyone who can write it can name any process
            claim.write("1\n")
        with pytest.raises(ConfigError, match=rf"another run \(pid {holder.pid}\)"):
            with exclusive(results):
                pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_the_store_init_lock_refuses_a_named_pipe_instead_of_blocking(tmp_path):
    from optim.tracking.stores import init_lock

    database = tmp_path / "optuna.db"
    os.mkfifo(tmp_path / "optuna.db.init.lock")
    outcome: list = []

    def take():
        try:
            with init_lock(f"sqlite:///{database}", "optuna"):
                outcome.append("locked")
        except ConfigError as exc:
            outcome.append(exc)

    # Opened for writing, a pipe blocks until a reader comes: a thread, so that such a hang fails the test instead.
    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    taker.join(60)
    assert outcome and isinstance(outcome[0], ConfigError), outcome
    assert "not a regular file" in str(outcome[0])
