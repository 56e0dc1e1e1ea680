"""What is read back, checked before it is used: results records, round checkpoints, snapshots.

Files on disk outlive versions and meet editors, disks and bad luck. An entry that cannot be used is
ignored (its callers count it in a warning, and the work is done again); one an older or newer
version wrote is read if it can be (a key RoundStats lacks is dropped, a key it has with a default
takes the default). Nothing read back reaches the runner or the summary unchecked.
"""
from __future__ import annotations

import dataclasses
import math

from ..compaction import Trajectory
from ..evaluate.confidence import MEASURES
from ..evaluate.stats import RoundStats
from .files import read_jsonl
from .keys import POOL_RUN


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _optional(check):
    return lambda x: x is None or check(x)


def _finite(x: object) -> bool:
    return _number(x) and math.isfinite(x)


# One check per RoundStats annotation: a field of a new type must say here how it is checked.
_CHECKS = {
    "int": _count,
    "float": _number,
    "int | None": _optional(_count),
    "float | None": _optional(_number),
    "dict[str, int]": lambda x: isinstance(x, dict) and all(isinstance(k, str) and _count(v) for k, v in x.items()),
    "list[str | None]": lambda x: isinstance(x, list) and all(a is None or isinstance(a, str) for a in x),
    "list[bool | None] | None": _optional(lambda x: isinstance(x, list) and all(a in (None, True, False) for a in x)),
}
_STATS_FIELDS = [(f.name, _CHECKS[f.type], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(RoundStats)]


def round_stats(d: object) -> RoundStats | None:
    """The RoundStats of a dict read back, or None if a key it needs is missing or of the wrong type."""
    if not isinstance(d, dict):
        return None
    known = {}
    for name, check, required in _STATS_FIELDS:
        if name in d:
            if not check(d[name]):
                return None
            known[name] = d[name]
        elif required:
            return None
    return RoundStats(**known)


def trajectory(d: object, index: int) -> Trajectory | None:
    """A ``round_responses`` entry read back, or None."""
    if not isinstance(d, dict) or not isinstance(d.get("content"), str):
        return None
    if not (_count(d.get("index", 0)) and _count(d.get("tokens", 0))
            and (d.get("finish_reason") is None or isinstance(d["finish_reason"], str))):
        return None
    if not all(_optional(_finite)(d.get(m)) for m in MEASURES):  # --record-confidence's, when recorded
        return None
    return Trajectory.from_record(d, index)


def restored_round(rec: dict) -> tuple[list[Trajectory], RoundStats] | None:
    """A round checkpoint's trajectories (recorded order) and stats, or None when it cannot be used:
    wrong types, missing keys, or not K responses."""
    k, responses = rec.get("k"), rec.get("responses")
    if not (_count(k) and k >= 1 and isinstance(responses, list) and len(responses) == k):
        return None
    trajectories = [trajectory(t, i) for i, t in enumerate(responses)]
    stats = round_stats(rec.get("stats"))
    if stats is None or stats.k != k or any(t is None for t in trajectories):
        return None
    if rec.get("run") == POOL_RUN and sorted(t.index for t in trajectories) != list(range(k)):
        return None  # runs draw pool trajectories by index
    return trajectories, stats


def usable_checkpoint(rec: object) -> bool:
    """Whether a line of the checkpoint file is a round checkpoint this version can continue from."""
    if not isinstance(rec, dict) or isinstance(rec.get("request_id"), (dict, list)) or rec.get("request_id") is None:
        return False
    run, round_no = rec.get("run", 0), rec.get("round")
    if not (_count(round_no) and round_no >= 1 and (run == POOL_RUN or _count(run))):
        return False
    if not (_count(rec.get("seed")) and isinstance(rec.get("shuffle"), str) and _optional(_count)(rec.get("pool"))):
        return False
    return restored_round(rec) is not None


def usable_result(rec: object) -> bool:
    """Whether a results record has the shape resume and the summary read: a run's success or error
    record, or an input line's error record."""
    if not isinstance(rec, dict):
        return False
    if rec.get("input_error"):
        return _count(rec.get("line")) and "error" in rec
    pid = rec.get("request_id")
    if pid is None or isinstance(pid, (dict, list)) or not _count(rec.get("run", 0)):
        return False
    if "error" in rec:
        return True
    stats = rec.get("rounds_stats", [])
    if not isinstance(stats, list) or any(round_stats(s) is None for s in stats):
        return False
    sc = rec.get("self_consistency")
    if rec.get("correct") not in (None, True, False) or not (sc is None or isinstance(sc, dict)):
        return False
    if sc is not None and sc.get("correct") not in (None, True, False):
        return False
    if not _count(rec.get("effective_compute_tokens", 0)):
        return False
    pool = rec.get("pool")
    return pool is None or (isinstance(pool, dict) and _count(pool.get("generated_tokens"))
                            and round_stats(pool.get("stats")) is not None)


def read_usable(path: str, usable) -> tuple[list[dict], int]:
    """The entries of a JSONL side file that pass ``usable``, and how many lines did not (unreadable
    or the wrong shape)."""
    values, unreadable = read_jsonl(path)
    good = [v for v in values if usable(v)]
    return good, unreadable + len(values) - len(good)


def usable_snapshot_record(rec: object) -> str | None:
    """Why a snapshot read back cannot be used (None: it can)."""
    if not isinstance(rec, dict):
        return f"a {type(rec).__name__}, not a snapshot"
    k, tokens, reasons = rec.get("k"), rec.get("tokens"), rec.get("finish_reasons")
    if not (isinstance(rec.get("key"), str) and _count(rec.get("round")) and _count(k) and _count(rec.get("seed"))
            and isinstance(rec.get("prompt"), str)):
        return "missing keys or keys of the wrong type"
    if not (isinstance(tokens, list) and isinstance(reasons, list) and len(tokens) == len(reasons) == k):
        return f"not K={k} trajectories"
    if not all(r is None or isinstance(r, str) for r in reasons):
        return "finish reasons of the wrong type"
    logprobs = rec.get("logprobs", [])
    if "logprobs" in rec and not (isinstance(logprobs, list) and len(logprobs) == k):
        return f"logprobs not of K={k} trajectories"
    if not all(lp is None or isinstance(lp, dict) for lp in logprobs):
        return "logprobs of the wrong type"
    return None
