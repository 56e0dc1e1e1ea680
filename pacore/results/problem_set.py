"""Which problems a results file answers: each problem's key and a hash of its content, recorded in the
settings file (settings.py) so that ``--resume`` never mixes problem sets.

Two problems files with the same ids can hold other questions or other ground truths; records of the old
ones would then be kept as done and graded against the old truths. So a resume compares the ``--data`` it
is given with the recorded set: a problem whose content changed, or a recorded one no longer in ``--data``
(another problems file), refuses the resume naming the ids, unless ``--override-settings``; problems
added to the file are new work and simply run. Whatever was recorded, a record whose problem is not in the
recorded set is never counted in the summary (``outside``: the summary leaves it out and names it).
"""
from __future__ import annotations

import hashlib
import json

from .problems import BadLine, Problem

SHOWN = 5  # ids named in one message; the rest are counted


def content_hash(problem: Problem) -> str:
    """SHA-256 of the problem's content as read (messages, ground truth, every other key but the id),
    canonical JSON: the same problem hashes alike in JSONL or a JSON array, keys in any order."""
    body = {**problem.extra, "messages": problem.messages}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def identity(items: list[Problem | BadLine]) -> dict[str, str]:
    """Problem key -> content hash, for the runnable problems of an input file (bad lines have none)."""
    return {p.key: content_hash(p) for p in items if isinstance(p, Problem)}


def valid(recorded: object) -> bool:
    """Whether a settings file's ``problems`` entry is the shape ``identity`` writes."""
    return isinstance(recorded, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in recorded.items())


def differences(recorded: dict[str, str], now: dict[str, str]) -> tuple[list[str], list[str]]:
    """(keys whose content changed, recorded keys not in ``now``), each in the recorded order."""
    changed = [k for k, h in recorded.items() if k in now and now[k] != h]
    missing = [k for k in recorded if k not in now]
    return changed, missing


def listed(changed: list[str], missing: list[str]) -> str:
    """The differences in words, naming at most SHOWN ids of each kind."""
    parts = []
    if changed:
        parts.append(f"{_ids(changed)} {'has' if len(changed) == 1 else 'have'} other content (question, "
                     f"ground truth or other fields)")
    if missing:
        parts.append(f"{_ids(missing)} {'is' if len(missing) == 1 else 'are'} not in --data")
    return "; ".join(parts)


def outside(records: list[dict], problems: dict[str, str]) -> list[str]:
    """The problem keys of ``records`` that are not in the set ``problems`` (first seen first)."""
    seen: dict[str, None] = {}
    for rec in records:
        if "request_id" in rec and not rec.get("input_error"):
            key = str(rec["request_id"])
            if key not in problems:
                seen.setdefault(key)
    return list(seen)


def _ids(keys: list[str]) -> str:
    shown = ", ".join(json.dumps(k) for k in keys[:SHOWN])
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return f"{'id' if len(keys) == 1 else 'ids'} {shown}{more}"
