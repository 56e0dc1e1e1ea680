"""Problems in: JSONL or a JSON array of PaCoRe problems; a bad line is reported, never fatal."""
from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from .files import loads_json
from .keys import problem_key

_BOM = b"\xef\xbb\xbf"


@dataclass(slots=True)
class Problem:
    """One valid input line (or element of a JSON array)."""

    line_no: int  # 1-based line of a JSONL file, or 1-based element of a JSON array
    id: object  # the input's id as given (string or number), or "req_N" (N = 0-based index) when absent
    messages: list[dict]
    extra: dict = field(default_factory=dict)  # every other input key, carried to the output

    @property
    def key(self) -> str:
        return problem_key(self.id)


@dataclass(slots=True)
class BadLine:
    """An input line that cannot be run, with the reason.

    It has no problem key on purpose: its error record is keyed by its line (``record_key``), so
    it can never stand for, or shadow, a valid problem with the same id.
    """

    line_no: int
    id: object
    error: str
    extra: dict = field(default_factory=dict)


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
    """Yield each problem of a PaCoRe input file as a Problem or a BadLine.

    The file is JSONL (one object per non-blank line) or, when its first character is ``[``, one
    JSON array of objects. A problem without an id gets ``req_N``, N its 0-based line or element
    index, as the reference pipeline names it. Lines that are not UTF-8, not JSON or not a valid
    problem, and every repeat of an id, are BadLines; they never stop the others.
    """
    with open(path, "rb") as f:
        if not f.seekable():  # a pipe (<(...), a FIFO): read once, whole, then parsed as a file
            f = io.BytesIO(f.read())
        head = f.read(len(_BOM))
        if head != _BOM:
            f.seek(0)
        first = f.read(4096).lstrip()
        f.seek(len(_BOM) if head == _BOM else 0)
        if first.startswith(b"["):
            entries = _array_entries(f.read())
        else:
            entries = _line_entries(f)
        seen: set[str] = set()
        for number, label, obj in entries:
            if isinstance(obj, _Unreadable):
                yield BadLine(number, f"req_{number - 1}", f"{label}: {obj.reason}")
                continue
            yield _problem(number, label, obj, seen)


@dataclass(slots=True)
class _Unreadable:
    reason: str


def _line_entries(f) -> Iterator[tuple[int, str, object]]:
    # Bytes, decoded line by line: one bad byte costs its line, not the run.
    for line_no, raw in enumerate(f, start=1):
        label = f"line {line_no}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield line_no, label, _Unreadable(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                                              f"save the file as UTF-8")
            continue
        if not line.strip():
            continue
        yield line_no, label, _parse(line)


def _array_entries(data: bytes) -> Iterator[tuple[int, str, object]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        yield 1, "file", _Unreadable(f"a JSON array that is not UTF-8 text (byte 0x{data[e.start]:02x} at "
                                     f"offset {e.start}); save the file as UTF-8")
        return
    items = _parse(text, whole_file=True)
    if isinstance(items, _Unreadable):
        yield 1, "file", items
        return
    for i, obj in enumerate(items, start=1):
        yield i, f"item {i}", obj


def _parse(text: str, whole_file: bool = False) -> object:
    """The JSON value of a line (or of the whole file, a JSON array), or why it is none: any failure of
    the JSON layer (bad syntax, a number too long, nesting too deep)."""
    what, then = ("invalid JSON array", "; no problem in it can run until it is fixed") if whole_file else \
        ("invalid JSON", "")
    try:
        return loads_json(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}" if whole_file else f"column {e.colno}"
        return _Unreadable(f"{what}: {e.msg} ({where}){then}")
    except ValueError as e:
        return _Unreadable(f"{what}: {e}{then}")


def _problem(number: int, label: str, obj: object, seen: set[str]) -> Problem | BadLine:
    default_id = f"req_{number - 1}"
    pid = obj.get("id", default_id) if isinstance(obj, dict) else default_id
    if isinstance(pid, (dict, list)) or pid is None:
        pid = default_id
    extra = {k: v for k, v in obj.items() if k != "id"} if isinstance(obj, dict) else {}
    error = _validate(obj)
    if error is None and problem_key(pid) in seen:
        error = f"duplicate id {pid!r} (first seen earlier in the file)"
    if error is not None:
        return BadLine(number, pid, f"{label}: {error}", extra)
    seen.add(problem_key(pid))
    return Problem(number, pid, obj["messages"], {k: v for k, v in extra.items() if k != "messages"})
