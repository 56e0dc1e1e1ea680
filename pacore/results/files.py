"""Results out: the files beside a results file, durable appends, atomic JSON documents.

The side files belong to the results file, not to its name: they sit beside its real path, so a run
reaching it through a symlink or another spelling uses the same checkpoints, snapshots and lock.
"""
from __future__ import annotations

import json
import os


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


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (also through links or a different spelling)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def loads_json(data: str | bytes) -> object:
    """``json.loads`` with every way it can fail as a ValueError: bad JSON (JSONDecodeError), bytes
    that are not UTF-8, a number too long to convert, or nesting too deep for the parser
    (RecursionError), so that one line read back or in can only cost that line."""
    try:
        return json.loads(data)
    except ValueError:
        raise
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None
    except MemoryError:
        raise ValueError("too large to parse in memory") from None


def cut_torn_line(path: str) -> None:
    with open(path, "rb+") as f:
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

    One writer per file: the run's lock (lock.py) is held on the results file itself, so a writer
    takes no lock of its own (a ``flock`` on a second descriptor would wait on that one forever).
    """

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        while data:  # a regular file takes it in one call; a short write (disk full) continues
            data = data[os.write(self._fd, data):]
        os.fsync(self._fd)

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
