"""Results out: the files beside a results file, durable appends, atomic JSON documents.

The side files belong to the results file, not to its name: they sit beside its real path, so a run
reaching it through a symlink or another spelling uses the same checkpoints, snapshots and lock.
Only ``--out`` itself may be a link: a run never writes through a link beside it (``check_side_files``
refuses one before any work; every write opens with ``O_NOFOLLOW``, temporaries with ``O_EXCL`` under
unpredictable names), so whoever can write into the output folder cannot make a run overwrite
another file. Every JSON is strict (``dumps``: no bare NaN).
"""
from __future__ import annotations

import json
import math
import os
import secrets
import stat
from collections.abc import Callable

from engine.jsonfile import loads_json  # noqa: F401 (every reader of a results file uses it from here)

from .lock import OutputUnusable


class WriteFailed(OSError):
    """A file of the run could not be written (a full disk, a quota, an I/O error), said in one sentence."""

    def __init__(self, path: str, error: OSError):
        super().__init__(error.errno, error.strerror or str(error), path)

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class OutputGone(WriteFailed):
    """The results file, or its whole folder, was removed while the run went on: nothing more can be saved."""

    def __str__(self) -> str:
        folder = os.path.dirname(self.filename)
        where = f"its folder {folder} is gone" if not os.path.isdir(folder) else "it is no longer at its path"
        return (f"{self.filename} was removed during the run ({where}); what this run recorded went with it, "
                f"and nothing more can be saved there")


def check_present(path: str, fd: int | None = None) -> None:
    """OutputGone if the file at ``path`` (the one open as ``fd``, when given) is no longer there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise OutputGone(path, OSError(2, "removed")) from None
    if fd is not None:
        mine = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
            raise OutputGone(path, OSError(2, "replaced")) from None


def side_path(out_path: str, suffix: str) -> str:
    """``suffix`` appended to the real path of ``out_path``."""
    return f"{os.path.realpath(out_path)}{suffix}"


def rounds_path(out_path: str) -> str:
    """The checkpoint file beside ``out_path``: one line per finished non-final round of a problem."""
    return side_path(out_path, ".rounds.jsonl")


def snapshot_dir(out_path: str) -> str:
    """The folder beside ``out_path`` holding snapshots of unfinished rounds (results/snapshots.py)."""
    return side_path(out_path, ".partial")


def summary_path(out_path: str) -> str:
    """Where the run summary of ``out_path`` is written."""
    return side_path(out_path, ".summary.json")


def check_side_files(out_path: str, others: tuple[str, ...] = ()) -> None:
    """Refuse (OutputUnusable) a symbolic link, or anything but a file of its own, at a side file's path
    (the checkpoints, the summary, ``others``) or anything but a real folder at the snapshots': a run
    would write through it into another file."""
    fix = "remove it, or choose another --out"
    for path in (rounds_path(out_path), summary_path(out_path), *others, snapshot_dir(out_path)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise OutputUnusable(f"{path} is a symbolic link; pacore never writes through a link beside the "
                                 f"results (it would overwrite the file it points to); {fix}")
        folder = path == snapshot_dir(out_path)
        if folder and not stat.S_ISDIR(st.st_mode):
            raise OutputUnusable(f"{path} is not a folder; pacore keeps the snapshots of rounds in flight there; {fix}")
        if not folder and not stat.S_ISREG(st.st_mode):
            raise OutputUnusable(f"{path} is not a regular file; {fix}")
        if not folder and st.st_nlink > 1:
            raise OutputUnusable(f"{path} has other names (hard links); pacore would write into a file that is "
                                 f"also elsewhere; {fix}")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (also through links or a different spelling)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def dumps(obj: object, indent: int | None = None) -> str:
    """Strict JSON (``allow_nan=False``): a float that is not finite (a measure of NaN logprobs) is
    written as null, and a dict's ``not_finite`` names each such value's place and what it was."""
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=indent)
    except ValueError:
        named: dict[str, str] = {}
        clean = _finite(obj, "", named)
        if isinstance(clean, dict):
            clean["not_finite"] = named
        return json.dumps(clean, ensure_ascii=False, allow_nan=False, indent=indent)


def _finite(x: object, at: str, named: dict[str, str]) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        named[at] = repr(x)
        return None
    if isinstance(x, dict):
        return {k: _finite(v, f"{at}.{k}" if at else str(k), named) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v, f"{at}[{i}]", named) for i, v in enumerate(x)]
    return x


def write_all(fd: int, data: bytes, path: str) -> None:
    """Write ``data`` whole to ``fd`` (a short write continues); WriteFailed names ``path`` and why."""
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError as e:
        raise WriteFailed(path, e) from None


def cut_torn_line(path: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    with open(fd, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)


def read_jsonl(path: str) -> tuple[list[object], int]:
    """The JSON values of a JSONL file's lines, and how many lines could not be read (a torn or
    corrupted line: bad JSON, not UTF-8, too deep or too large to parse)."""
    values, unreadable = [], 0
    if not os.path.exists(path):
        return values, unreadable
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                values.append(loads_json(line))
            except ValueError:
                unreadable += 1
    return values, unreadable


def read_results(path: str) -> list[dict]:
    """All records (JSON objects) of a results file; what they hold is checked where it is used
    (shapes.py)."""
    return [rec for rec in read_jsonl(path)[0] if isinstance(rec, dict)]


class ResultsWriter:
    """Appends one JSON line per problem and makes it durable before returning.

    ``path`` is opened as it is spelled, never through a link (pass the real path of a results file
    that may be reached by one). A write that fails (a full disk) is cut back off, so the file never
    holds half a line, and raises WriteFailed.
    One writer per file: the run's lock (lock.py) is held on the results file itself, so a writer
    takes no lock of its own (a ``flock`` on a second descriptor would wait on that one forever).
    """

    def __init__(self, path: str):
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if os.path.islink(path):
                raise OutputUnusable(f"{path} is a symbolic link; pacore never writes through a link beside the "
                                     f"results; remove it, or choose another --out") from None
            raise WriteFailed(path, e) from None

    def write(self, record: dict) -> None:
        check_present(self.path, self._fd)  # a write into a removed file would succeed, and be lost
        data = (dumps(record) + "\n").encode("utf-8")
        end = os.fstat(self._fd).st_size
        try:
            write_all(self._fd, data, self.path)
            os.fsync(self._fd)
        except OSError as e:
            os.ftruncate(self._fd, end)  # no half line for the next append to continue
            raise (e if isinstance(e, WriteFailed) else WriteFailed(self.path, e)) from None

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def replace_atomically(name: str, fill: Callable[[int], None], dir_fd: int | None = None,
                       shown: str | None = None) -> None:
    """Write a file atomically (a reader never sees half of it): ``fill(fd)`` a new temporary file of an
    unpredictable name, created here (``O_EXCL``: never one planted there), then rename it over ``name``
    (relative to ``dir_fd`` when given), which replaces a link there, never its target. WriteFailed
    naming ``shown`` (default ``name``) when it cannot be written; the temporary file is removed."""
    shown = shown or name
    tmp = f"{name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as e:
        raise WriteFailed(shown, e) from None
    try:
        try:
            fill(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as e:  # a full disk: leave no half-written file to fill it further
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and not isinstance(e, WriteFailed):
            raise WriteFailed(shown, e) from None
        raise


def write_json(path: str, obj: dict) -> None:
    """Write a JSON document atomically (``replace_atomically``), strict (``dumps``)."""
    data = (dumps(obj, indent=2) + "\n").encode("utf-8")
    replace_atomically(path, lambda fd: write_all(fd, data, path))
