"""Every JSON the project reads goes through here: whatever is wrong with it (bad syntax, bytes that are
not UTF-8, a number too long to convert, nesting too deep for the parser, too large for memory) is one
ValueError, so a bad file or flag is refused in one line, never with a RecursionError traceback.

Torch-free and imports nothing of the engine: ``pacore --help`` and the results files use it too.
"""
from __future__ import annotations

import json
from pathlib import Path


def loads_json(data: str | bytes) -> object:
    """``json.loads`` with every way it can fail as a ValueError (JSONDecodeError for bad syntax, so its
    line and column stay readable)."""
    try:
        return json.loads(data)
    except ValueError:
        raise
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None
    except MemoryError:
        raise ValueError("too large to parse in memory") from None


def read_json(path: str | Path) -> object:
    """The JSON value of the file at ``path``; ValueError naming the file and what is wrong with it."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        return loads_json(data)
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
