"""JSONL in and out: reading problems (bad lines reported, never fatal), durable appends, resume."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field


class OutputExistsError(RuntimeError):
    """The output file already holds results and --resume was not given."""


@dataclass(slots=True)
class Problem:
    """One valid input line."""

    line_no: int
    id: object  # the input's id as given (string or number), or "line_N" when absent
    messages: list[dict]
    extra: dict = field(default_factory=dict)  # every other input key, carried to the output

    @property
    def key(self) -> str:
        return problem_key(self.id)

    @property
    def original_prompt(self) -> str:
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")


@dataclass(slots=True)
class BadLine:
    """An input line that cannot be run, with the reason."""

    line_no: int
    id: object
    error: str
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return problem_key(self.id)


def problem_key(pid: object) -> str:
    """The identity used for resume and duplicate checks (ids 7 and "7" are the same problem)."""
    return str(pid)


def _validate(obj: object) -> str | None:
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "missing or empty 'messages' list"
    for j, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            return f"messages[{j}] is not an object with 'role' and 'content'"
    users = [m for m in msgs if m["role"] == "user"]
    if not users:
        return "no user message in 'messages'"
    if not isinstance(users[-1]["content"], str):
        return "the last user message's content must be a string"
    return None


def read_problems(path: str) -> Iterator[Problem | BadLine]:
    """Yield each non-blank line of a PaCoRe JSONL file as a Problem or a BadLine.

    Duplicate ids are reported as BadLine for every occurrence after the first.
    """
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            default_id = f"line_{line_no}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield BadLine(line_no, default_id, f"line {line_no}: invalid JSON: {e.msg} (column {e.colno})")
                continue
            pid = obj.get("id", default_id) if isinstance(obj, dict) else default_id
            if isinstance(pid, (dict, list)) or pid is None:
                pid = default_id
            extra = {k: v for k, v in obj.items() if k != "id"} if isinstance(obj, dict) else {}
            error = _validate(obj)
            if error is None and problem_key(pid) in seen:
                error = f"duplicate id {pid!r} (first seen earlier in the file)"
            if error is not None:
                yield BadLine(line_no, pid, f"line {line_no}: {error}", extra)
                continue
            seen.add(problem_key(pid))
            yield Problem(line_no, pid, obj["messages"], {k: v for k, v in extra.items() if k != "messages"})


def rounds_path(out_path: str) -> str:
    """The checkpoint file beside ``out_path``: one line per finished non-final round of a problem."""
    return f"{out_path}.rounds.jsonl"


def partial_dir(out_path: str) -> str:
    """The folder beside ``out_path`` holding snapshots of unfinished rounds (pacore/partial.py)."""
    return f"{out_path}.partial"


def prepare_output(path: str, resume: bool) -> set[str]:
    """Check the output path (and its round checkpoints) and return the keys of finished problems.

    Without ``resume`` a non-empty file is refused. With it, a torn last line (a kill in the middle
    of a write) is cut off so the next append starts on a fresh line.
    """
    held = [p for p in (path, rounds_path(path)) if os.path.exists(p) and os.path.getsize(p) > 0]
    snapshots = partial_dir(path)
    if not held and os.path.isdir(snapshots) and os.listdir(snapshots):
        held = [snapshots]
    if not held:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return set()
    if not resume:
        raise OutputExistsError(
            f"{held[0]} already holds results; pass --resume to skip the problems it has and finish "
            f"the rest, or choose another --out path"
        )
    for p in held:
        if os.path.isfile(p):
            _cut_torn_line(p)  # the torn line's problem (or round) is simply run again
    return {problem_key(rec["request_id"]) for rec in read_results(path) if "request_id" in rec}


def _cut_torn_line(path: str) -> None:
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)


def read_round_checkpoints(out_path: str) -> dict[str, list[dict]]:
    """Problem key -> its checkpointed rounds 1..r, in order (a gap ends the usable run of rounds)."""
    by_key: dict[str, dict[int, dict]] = {}
    for rec in read_results(rounds_path(out_path)):
        if "request_id" in rec and isinstance(rec.get("round"), int):
            by_key.setdefault(problem_key(rec["request_id"]), {})[rec["round"]] = rec
    out: dict[str, list[dict]] = {}
    for key, rounds in by_key.items():
        run = []
        while len(run) + 1 in rounds:
            run.append(rounds[len(run) + 1])
        if run:
            out[key] = run
    return out


def read_results(path: str) -> list[dict]:
    """All well-formed records of a results file."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


class ResultsWriter:
    """Appends one JSON line per problem and makes it durable before returning.

    Safe with several writers on one file (the replicas of a data-parallel run): each line is one
    ``write`` to an O_APPEND descriptor under an exclusive lock, so lines never interleave.
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
