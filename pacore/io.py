"""Results out: durable appends, one record per problem kept on resume, round checkpoints."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from .problems import BadLine, Problem, run_key


class OutputExistsError(RuntimeError):
    """The output file already holds results and --resume was not given."""


def rounds_path(out_path: str) -> str:
    """The checkpoint file beside ``out_path``: one line per finished non-final round of a problem."""
    return f"{out_path}.rounds.jsonl"


def partial_dir(out_path: str) -> str:
    """The folder beside ``out_path`` holding snapshots of unfinished rounds (pacore/partial.py)."""
    return f"{out_path}.partial"


@dataclass(slots=True)
class PriorResults:
    """What earlier sessions left in a results file: the basis of --resume."""

    done: set[str] = field(default_factory=set)  # run keys (run_key) with a success record
    failed: set[str] = field(default_factory=set)  # run keys with error records only
    bad_lines: dict[int, str] = field(default_factory=dict)  # input line -> its latest recorded input error


def record_key(rec: dict) -> tuple[str, str] | None:
    """What a results record is about: ("problem", key), or ("line", N) for an input line that is no
    problem (bad JSON, duplicate id, ...), so that such a line never counts as, or shadows, a problem."""
    if rec.get("input_error") and isinstance(rec.get("line"), int):
        return ("line", str(rec["line"]))
    if "request_id" in rec:
        return ("problem", run_key(rec["request_id"], rec.get("run", 0)))  # each run of a problem apart
    return None


def latest_records(records: list[dict]) -> list[dict]:
    """One record per problem (or bad input line): the latest, except that a success beats any error.

    A results file is an append-only history (a failed problem retried on --resume has an error and
    then a success); everything that counts problems reads it through this.
    """
    best: dict[tuple[str, str], dict] = {}
    for rec in records:
        key = record_key(rec)
        if key is None:
            continue
        old = best.get(key)
        if old is None or "error" not in rec or "error" in old:
            best[key] = rec
    return list(best.values())


def prepare_output(path: str, resume: bool) -> PriorResults:
    """Check the output path (and its round checkpoints) and return what earlier sessions finished.

    Without ``resume`` a non-empty file is refused. With it, a torn last line (a kill in the middle
    of a write) is cut off so the next append starts on a fresh line. Only a success record makes a
    problem done; error records stay in the file as history.
    """
    held = [p for p in (path, rounds_path(path)) if os.path.exists(p) and os.path.getsize(p) > 0]
    snapshots = partial_dir(path)
    if not held and os.path.isdir(snapshots) and os.listdir(snapshots):
        held = [snapshots]
    if not held:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return PriorResults()
    if not resume:
        raise OutputExistsError(
            f"{held[0]} already holds results; pass --resume to skip the problems it has and finish "
            f"the rest, or choose another --out path"
        )
    for p in held:
        if os.path.isfile(p):
            _cut_torn_line(p)  # the torn line's problem (or round) is simply run again
    prior = PriorResults()
    for rec in latest_records(read_results(path)):
        kind, key = record_key(rec)
        if kind == "line":
            prior.bad_lines[int(key)] = rec.get("error")
        elif "error" in rec:
            prior.failed.add(key)
        else:
            prior.done.add(key)
    return prior


def select_pending(items: Iterator[Problem | BadLine], prior: PriorResults, skip_failed: bool = False,
                   runs: int = 1) -> tuple[list[Problem | BadLine], str | None]:
    """The input items this session runs, and a note saying what a resume takes over (None if nothing).

    Done problems (all ``runs`` of them done) are skipped; failed ones run again unless ``skip_failed``;
    a bad line whose very error is already recorded is not recorded again (it has nothing new to say).
    """
    todo: list[Problem | BadLine] = []
    done = retried = skipped = 0
    for item in items:
        if isinstance(item, BadLine):
            if prior.bad_lines.get(item.line_no) != item.error:
                todo.append(item)
            continue
        left = [k for k in (run_key(item.id, r) for r in range(runs)) if k not in prior.done]
        if not left:
            done += 1
        elif skip_failed and all(k in prior.failed for k in left):
            skipped += 1
        else:
            retried += any(k in prior.failed for k in left)
            todo.append(item)
    if not (done or retried or skipped):
        return todo, None
    if skip_failed:
        return todo, f"resuming: {_n(done)} done, {_n(skipped)} failed earlier skipped (--skip-failed)"
    return todo, f"resuming: {_n(done)} done, {_n(retried)} failed earlier will run again"


def _n(count: int) -> str:
    return f"{count} problem{'' if count == 1 else 's'}"


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (also through links or a different spelling)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def _cut_torn_line(path: str) -> None:
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
