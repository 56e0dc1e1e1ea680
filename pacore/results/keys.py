"""Every key a run writes or matches, in one place: the names on disk must never change (a results file
from an earlier version still resumes), so each format is spelled out once here.

- ``problem_key``: a problem's identity (ids 7 and "7" are one problem).
- ``run_key``: a run's identity in the results file, for resume (in memory only: the key, or (key, run)).
- ``unit_key``: the name of a run, or of a problem's pool, in request ids and snapshot files
  (``KEY#runR``, ``KEY#pool``); run 0 keeps the bare key, as a single run was named before runs existed.
- ``request_id``: the engine request of a unit's round (``UNIT#rN``).

Every name is injective, whatever the id: in names, the key has its ``%`` and ``#`` escaped (``%25``,
``%23``), so the first ``#`` of a name always ends the key. An id holding neither keeps the very names
earlier versions wrote, so their snapshots still resume.
- ``record_key``: what a results record is about: a run of a problem, or an input line that is none.
- ``parse_request_id``: a request id read back into its problem key, run and round (bench/rehearsal/).
"""
from __future__ import annotations

from dataclasses import dataclass

POOL_RUN = "pool"  # the "run" of a pool's round checkpoint record


def problem_key(pid: object) -> str:
    """The identity used for resume and duplicate checks (ids 7 and "7" are the same problem)."""
    return str(pid)


def run_key(pid: object, run: int = 0) -> str | tuple[str, int]:
    """The resume identity of run ``run`` of a problem (``pacore run --runs``): its problem key for run 0
    (and for records without a "run"), the pair (key, run) otherwise: a string never equals a pair, so
    no id can stand for another id's run."""
    key = problem_key(pid)
    return key if not run else (key, run)


def _name(key: str) -> str:
    return key.replace("%", "%25").replace("#", "%23")


def unit_key(key: str, run: int) -> str:
    """The name of run ``run`` of the problem ``key`` in request ids and snapshots."""
    return _name(key) if run == 0 else f"{_name(key)}#run{run}"


def pool_key(key: str) -> str:
    """The name of the problem ``key``'s round-1 pool in request ids and snapshots."""
    return f"{_name(key)}#{POOL_RUN}"


def request_id(unit: str, round_no: int) -> str:
    """The engine request id of round ``round_no`` (1-based) of a unit (``unit_key`` or ``pool_key``)."""
    return f"{unit}#r{round_no}"


@dataclass(frozen=True, slots=True)
class RequestKey:
    """What a request id names: a round of a run (or of the pool, run ``POOL_RUN``) of a problem."""

    problem_id: str  # the problem key
    run: int | str
    round: int


def parse_request_id(rid: str) -> RequestKey:
    """The inverse of ``request_id(unit_key(key, run) or pool_key(key), round)``; ValueError for an id
    that is none of them."""
    name, *suffixes = rid.split("#")  # the key's own '#' are escaped, so the first one ends it
    key = name.replace("%23", "#").replace("%25", "%")
    if _name(key) != name or not suffixes or not suffixes[-1].startswith("r") or len(suffixes) > 2:
        raise ValueError(f"{rid!r} is not a PaCoRe request id (KEY[#runR|#pool]#rN)")
    run: int | str = 0
    if len(suffixes) == 2:
        run = POOL_RUN if suffixes[0] == POOL_RUN else _number(suffixes[0].removeprefix("run"), rid)
        if run != POOL_RUN and (not suffixes[0].startswith("run") or run == 0):
            raise ValueError(f"{rid!r} is not a PaCoRe request id (KEY[#runR|#pool]#rN)")
    return RequestKey(key, run, _number(suffixes[-1][1:], rid))


def _number(text: str, rid: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{rid!r} is not a PaCoRe request id (KEY[#runR|#pool]#rN)")
    return int(text)


def record_key(rec: dict) -> tuple[str, object] | None:
    """What a results record is about: ("problem", run_key), or ("line", N) for an input line that is no
    problem (bad JSON, duplicate id, ...), so that such a line never counts as, or shadows, a problem."""
    if rec.get("input_error") and isinstance(rec.get("line"), int):
        return ("line", str(rec["line"]))
    if "request_id" in rec:
        return ("problem", run_key(rec["request_id"], rec.get("run", 0)))  # each run of a problem apart
    return None
