"""One run per results file: an OS lock on ``OUT.lock``, held by the run's parent process.

``flock`` belongs to the open file, so the kernel drops it when the holder dies however it dies
(kill -9 included): a lock file left behind by a dead run is taken over, never waited on. The
holder's pid is written into the file only to name it in the message a second run gets.
Data-parallel replicas never take this lock, nor write the results: they send their records to the
parent (replicas/driver.py), which writes them under it.
"""
from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Lock files this process holds (real path -> descriptor): a nested results_lock on the same
# results file (the CLI, then run_data_parallel inside it) is a no-op instead of a self-deadlock.
_held: dict[str, int] = {}


class ResultsLocked(RuntimeError):
    """Another live process is running on the same results file."""


def lock_path(out_path: str) -> str:
    """The lock file beside ``out_path``."""
    return f"{out_path}.lock"


@contextmanager
def results_lock(out_path: str) -> Iterator[None]:
    """Hold the exclusive lock of ``out_path`` for the duration; raise ResultsLocked if another run has it."""
    path = os.path.realpath(lock_path(out_path))
    if path in _held:
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = _acquire(path, out_path)
    _held[path] = fd
    try:
        yield
    finally:
        del _held[path]
        try:
            # Unlinked while still locked: a run that opened this inode and locks it after we close
            # sees that it is no longer the file at `path` and tries again (see _acquire).
            os.unlink(path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def _acquire(path: str, out_path: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise ResultsLocked(
                f"{out_path} is in use by another pacore run ({who}); wait for it to finish, "
                f"or choose another --out"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(fd).st_ino:  # its holder removed it as we opened it: start over
            os.close(fd)
            continue
        stale = _read_pid(fd)
        if stale and stale != os.getpid():
            # A clean exit removes the file, so a pid left in it is a run that was killed.
            print(f"pacore: {path} was left by pid {stale}, which is no longer running; taking it over",
                  file=sys.stderr)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
