"""Results out: the files beside a results file, durable appends, atomic JSON documents."""
from __future__ import annotations

import fcntl
import json
import os


def rounds_path(out_path: str) -> str:
    """The checkpoint file beside ``out_path``: one line per finished non-final round of a problem."""
    return f"{out_path}.rounds.jsonl"


def snapshot_dir(out_path: str) -> str:
    """The folder beside ``out_path`` holding snapshots of unfinished rounds (results/snapshots.py)."""
    return f"{out_path}.partial"


def summary_path(out_path: str) -> str:
    """Where the run summary of ``out_path`` is written."""
    return f"{out_path}.summary.json"


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (also through links or a different spelling)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def cut_torn_line(path: str) -> None:
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)


def read_results(path: str) -> list[dict]:
    """All well-formed records of a results file."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, "rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:  # a torn or corrupted line (bad JSON or not UTF-8) is skipped
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


class ResultsWriter:
    """Appends one JSON line per problem and makes it durable before returning.

    Safe with several writers on one file: each line is one ``write`` to an O_APPEND descriptor
    under an exclusive lock, so lines never interleave.
    """

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            while data:  # a regular file takes it in one call; a short write (disk full) continues
                data = data[os.write(self._fd, data):]
            os.fsync(self._fd)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_json(path: str, obj: dict) -> None:
    """Write a JSON document atomically (a reader never sees half of it)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
