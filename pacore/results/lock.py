"""One run per results file: an OS lock on the results file itself, held by the run's parent process.

The lock is keyed on the file's identity, not on how it is spelled: ``--out`` is resolved to its real
path, created if need be, and ``flock`` is taken on that inode, so a second run reaching the same file
by a symlink, a hard link or another spelling finds it locked. ``flock`` belongs to the open file, so
the kernel drops it when the holder dies however it dies (kill -9 included): a killed run's lock is
taken over, never waited on. The holder's pid is written to ``REAL.lock`` only to name it in the
message a second run gets; that file is never followed if it is a link, never written if it holds
anything but a pid, and deleted only by the run that wrote it.
Data-parallel replicas never take this lock, nor write the results: they send their records to the
parent (replicas/driver.py), which writes them under it.

This module imports nothing of pacore (tests run it alone, without torch).
"""
from __future__ import annotations

import fcntl
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Results files this process holds ((device, inode) -> descriptor): a nested results_lock on the same
# file (the CLI, then run_data_parallel inside it) is a no-op instead of a self-deadlock.
_held: dict[tuple[int, int], int] = {}


class ResultsLocked(RuntimeError):
    """Another live process is running on the same results file."""


class OutputUnusable(RuntimeError):
    """``--out`` (or the lock file beside it) cannot be used: not writable, not a regular file, a link."""


def lock_path(out_path: str) -> str:
    """The pid file beside the real path of ``out_path``."""
    return f"{os.path.realpath(out_path)}.lock"


@contextmanager
def results_lock(out_path: str) -> Iterator[None]:
    """Hold the exclusive lock of ``out_path`` for the duration; raise ResultsLocked if another run has
    it, OutputUnusable if the file or its lock file cannot be used (a full disk included). A results
    file this call created is removed again if the run stops before anything is written to it: at
    start-up, or by an error writing (OSError) such as a full disk (a run that stops otherwise before it
    computed anything is undone by the preflight)."""
    fd, created = _open_results(out_path)
    st = os.fstat(fd)
    identity = (st.st_dev, st.st_ino)
    if identity in _held:
        os.close(fd)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_pid(lock_path(out_path), st)
        os.close(fd)
        who = f"pid {holder}" if holder else "another process"
        raise ResultsLocked(f"{out_path} is in use by another pacore run ({who}); wait for it to finish, "
                            f"or choose another --out") from None
    if not _at_its_path(out_path, st):  # a run that failed to start removed it while this one opened it
        os.close(fd)
        raise ResultsLocked(f"{out_path} was removed or replaced while this run started; run again")
    try:
        pid_fd = _claim_pid_file(lock_path(out_path), out_path)
    except BaseException:
        _remove_if_empty(out_path, fd, created)
        os.close(fd)
        raise
    _held[identity] = fd
    try:
        yield
    except OSError:
        _remove_if_empty(out_path, fd, created)
        raise
    finally:
        del _held[identity]
        try:
            _remove_if_ours(lock_path(out_path), pid_fd)
        finally:
            os.close(pid_fd)
            os.close(fd)


def _open_results(out_path: str) -> tuple[int, bool]:
    """The results file's descriptor, and whether this call created it."""
    real = os.path.realpath(out_path)
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
    except OSError as e:
        raise OutputUnusable(f"cannot create the folder of --out {out_path}: {e.strerror} "
                             f"({os.path.dirname(real)}); choose another --out") from None
    try:  # the type first: opening a FIFO to write waits for a reader, forever
        mode = os.stat(real).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputUnusable(f"--out {out_path} is not a regular file; choose a file path for the results")
    # O_NONBLOCK: should a FIFO take the file's place after that check, the open fails instead of waiting
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        try:
            fd, created = os.open(real, flags | os.O_EXCL, 0o644), True
        except FileExistsError:
            fd, created = os.open(real, flags, 0o644), False
    except OSError as e:
        raise OutputUnusable(f"cannot write --out {out_path}: {e.strerror}; choose a writable --out") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputUnusable(f"--out {out_path} is not a regular file; choose a file path for the results")
    return fd, created


def _at_its_path(out_path: str, st: os.stat_result) -> bool:
    try:
        now = os.stat(out_path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _remove_if_empty(out_path: str, fd: int, created: bool) -> None:
    """Remove the results file this run created if it is still empty and still at its path (locked: no
    other run writes it)."""
    real = os.path.realpath(out_path)
    try:
        st, mine = os.lstat(real), os.fstat(fd)
        if created and mine.st_size == 0 and (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
            os.unlink(real)
    except OSError:
        pass


def _claim_pid_file(path: str, out_path: str) -> int:
    """Open the pid file at ``path`` (never through a link, never one holding anything but a pid) and
    write this process's pid into it. The results file is locked already, so no other run of this
    version touches it; an earlier version locked this file itself, so it is locked too."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        _check_pid_file(path, st, out_path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise OutputUnusable(f"cannot use the lock file {path}: {e.strerror}; remove it or choose another "
                             f"--out") from None
    try:
        _check_pid_file(path, os.fstat(fd), out_path)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise ResultsLocked(f"{out_path} is in use by another pacore run ({f'pid {holder}' if holder else 'another process'}); "
                            f"wait for it to finish, or choose another --out") from None
    except BaseException:
        os.close(fd)
        raise
    stale = _read_pid(fd)
    if stale and stale != os.getpid():
        if _alive(stale):
            print(f"pacore: {path} names pid {stale}, which is still running but does not hold the lock "
                  f"(its pid was reused, or it runs on another file); taking it over", file=sys.stderr)
        else:  # a clean exit removes the file, so a pid left in it is a run that was killed
            print(f"pacore: {path} was left by pid {stale}, which is no longer running; taking it over",
                  file=sys.stderr)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:  # a full disk: no empty lock file left behind
        _remove_if_ours(path, fd)
        os.close(fd)
        raise OutputUnusable(f"cannot write the lock file {path}: {e.strerror}; free space on its disk, or "
                             f"choose another --out") from None
    return fd


def _check_pid_file(path: str, st: os.stat_result, out_path: str) -> None:
    fix = "remove it, or choose another --out"
    if stat.S_ISLNK(st.st_mode):
        raise OutputUnusable(f"the lock file {path} is a symbolic link; pacore never follows a link there "
                             f"(it would write its pid into the target and delete it); {fix}")
    if stat.S_ISDIR(st.st_mode):
        raise OutputUnusable(f"the lock file {path} of --out {out_path} is a directory; {fix}")
    if not stat.S_ISREG(st.st_mode):
        raise OutputUnusable(f"the lock file {path} is not a regular file; {fix}")
    if st.st_nlink != 1 or st.st_size > 32 or not _holds_a_pid(path):
        raise OutputUnusable(f"{path} is not a pacore lock file (it holds other data, or has other names); "
                             f"pacore would overwrite it; {fix}")


def _holds_a_pid(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        text = os.read(fd, 64).strip()
    finally:
        os.close(fd)
    return not text or text.isdigit()


def _remove_if_ours(path: str, fd: int) -> None:
    """Delete the pid file only if it is still the file this run wrote (never another one at its path)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    mine = os.fstat(fd)
    if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
        os.unlink(path)


def _holder_pid(pid_path: str, st: os.stat_result) -> int | None:
    """The pid holding the lock: from the pid file beside this spelling, else (another name of the file,
    a hard link) from the kernel's table of locks, keyed on device and inode."""
    try:
        fd = os.open(pid_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            pid = _read_pid(fd)
        finally:
            os.close(fd)
        if pid:
            return pid
    except OSError:
        pass
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == want:
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, alive
        return True
    return True


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
