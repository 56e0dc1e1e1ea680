"""Resume: what earlier sessions left in a results file, and what this session still has to do.

``prepare_output`` reads the results file (a success record makes a run done, error records stay as
history), ``select_pending`` picks the input lines to run, and ``read_prior_work`` gathers, per problem,
its done runs, its checkpointed rounds and its pool, which the runner continues from (runner.py).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..config import RunConfig
from ..evaluate.confidence import MEASURES
from .files import cut_torn_line, rounds_path, snapshot_dir
from .keys import POOL_RUN, pool_key, problem_key, record_key, run_key, unit_key
from .problems import BadLine, Problem
from .shapes import read_usable, usable_checkpoint, usable_result


class OutputExistsError(RuntimeError):
    """The output file already holds results and --resume was not given."""


@dataclass(slots=True)
class PriorResults:
    """What earlier sessions left in a results file: the basis of --resume."""

    done: set[str] = field(default_factory=set)  # run keys (run_key) with a success record
    failed: set[str] = field(default_factory=set)  # run keys with error records only
    bad_lines: dict[int, str] = field(default_factory=dict)  # input line -> its latest recorded input error
    fresh: bool = True  # the output held nothing: no results, checkpoints or snapshots
    # done runs whose trajectories carry --record-confidence's measures, and those whose do not
    runs_measured: int = 0
    runs_unmeasured: int = 0


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
    snapshots = snapshot_dir(path)
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
            cut_torn_line(p)  # the torn line's problem (or round) is simply run again
    prior = PriorResults(fresh=False)
    records, ignored = read_usable(path, usable_result)
    if ignored:
        print(f"pacore: ignored {_count(ignored, 'record')} of {path} that cannot be used (unreadable, or not "
              f"the shape of a result); their problems run again unless another record has them done",
              file=sys.stderr)
    for rec in latest_records(records):
        kind, key = record_key(rec)
        if kind == "line":
            prior.bad_lines[int(key)] = rec.get("error")
        elif "error" in rec:
            prior.failed.add(key)
        else:
            prior.done.add(key)
            if _measured(rec.get("round_responses")):
                prior.runs_measured += 1
            else:
                prior.runs_unmeasured += 1
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
    return _count(count, "problem")


def _count(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


@dataclass(slots=True)
class PriorWork:
    """What earlier sessions finished of one problem: done runs, checkpointed rounds, its pool."""

    runs_done: set[int] = field(default_factory=set)
    rounds: dict[int, list[dict]] = field(default_factory=dict)  # run -> checkpoint records of rounds 1..r
    pool: dict | None = None  # the pool's checkpoint record


def read_prior_work(cfg: RunConfig, todo: list, prior: PriorResults) -> dict[str, PriorWork]:
    """Problem key -> what earlier sessions left of it, for the problems in ``todo``.

    A run is done when it has a success record (or, with --skip-failed, only error records). Rounds
    count only as a gapless sequence from round 1 (from round 2 with a pool: round 1 is the draw).
    """
    problems = {x.key: x for x in todo if isinstance(x, Problem)}
    by_run: dict[str, dict[int, dict[int, dict]]] = {}
    pools: dict[str, dict] = {}
    path = rounds_path(cfg.out_path)
    records, ignored = read_usable(path, usable_checkpoint)
    if ignored:
        print(f"pacore: ignored {_count(ignored, 'round checkpoint')} of {path} that this version cannot use "
              f"(unreadable, wrong types, missing keys, or not K responses); those rounds run again",
              file=sys.stderr)
    for rec in records:
        key = problem_key(rec["request_id"])
        if key not in problems:
            continue
        run = rec.get("run", 0)
        if run == POOL_RUN:
            pools[key] = rec
        else:
            by_run.setdefault(key, {}).setdefault(run, {})[rec["round"]] = rec
    out: dict[str, PriorWork] = {}
    first = 2 if cfg.pool else 1
    for key, problem in problems.items():
        work = PriorWork(pool=pools.get(key))
        for run in range(cfg.runs):
            rk = run_key(problem.id, run)
            if rk in prior.done or (cfg.skip_failed and rk in prior.failed):
                work.runs_done.add(run)
            rounds = by_run.get(key, {}).get(run, {})
            seq = []
            while first + len(seq) in rounds:
                seq.append(rounds[first + len(seq)])
            if seq:
                work.rounds[run] = seq
        if work.runs_done or work.rounds or work.pool:
            out[key] = work
    return out


def stale_snapshots(prior: PriorResults, work: dict[str, PriorWork]) -> tuple[set[str], set[tuple[str, int]]]:
    """The snapshots no session will continue from, which a kill between a write and a snapshot's removal
    leaves: (units whose every round's are stale: the runs recorded done and the pools of problems with
    a run done or a pool checkpointed, {(unit, round)} of the rounds checkpointed). A failed run's stay:
    a resume continues it from them."""
    units: set[str] = set()
    for rk in prior.done:
        key, run = (rk, 0) if isinstance(rk, str) else rk
        units.update((unit_key(key, run), pool_key(key)))  # a run done: its pool was checkpointed first
    rounds: set[tuple[str, int]] = set()
    for key, w in work.items():
        if w.pool is not None:
            units.add(pool_key(key))
        rounds.update((unit_key(key, run), rec["round"]) for run, recs in w.rounds.items() for rec in recs)
    return units, rounds


def _measured(rounds: object) -> bool:
    """Whether a record's trajectories (per round) carry --record-confidence's measures."""
    return isinstance(rounds, list) and any(isinstance(t, dict) and any(m in t for m in MEASURES)
                                            for rnd in rounds if isinstance(rnd, list) for t in rnd)


def confidence_note(cfg: RunConfig, prior: PriorResults, work: dict[str, PriorWork]) -> str | None:
    """What a resume says when the output's finished runs and checkpointed rounds were recorded with
    --record-confidence and this session runs without it, or the other way round (None: neither): the
    summary's confidence table then covers only the trajectories that have the measures."""
    checkpoints = [rec for w in work.values() for rec in [*(r for recs in w.rounds.values() for r in recs),
                                                          *([w.pool] if w.pool else [])]]
    if cfg.record_confidence:  # what earlier sessions recorded without it
        runs = prior.runs_unmeasured
        rounds = sum(not _measured([rec.get("responses")]) for rec in checkpoints)
    else:
        runs = prior.runs_measured
        rounds = sum(_measured([rec.get("responses")]) for rec in checkpoints)
    if not (runs or rounds):
        return None
    held = " and ".join(x for x in (runs and _count(runs, "finished run"), rounds and _count(rounds, "checkpointed round"))
                        if x)
    if cfg.record_confidence:
        return (f"{held} in {cfg.out_path} were recorded without --record-confidence: their trajectories have no "
                f"confidence measures, and the summary's confidence table covers only those that have them")
    return (f"{held} in {cfg.out_path} were recorded with --record-confidence, but this session runs without it: "
            f"its trajectories get no confidence measures, and the summary's confidence table will cover only "
            f"the others; pass --record-confidence to keep it whole")


def runs_left(cfg: RunConfig, work: PriorWork | None) -> list[int]:
    """The runs of a problem this session still has to do."""
    done = work.runs_done if work else set()
    return [run for run in range(cfg.runs) if run not in done]


def usable_pool(cfg: RunConfig, work: PriorWork | None) -> dict | None:
    """The problem's checkpointed pool, if it was sampled with this --pool and --seed."""
    rec = work.pool if work else None
    return rec if rec is not None and (rec.get("k"), rec.get("seed")) == (cfg.pool, cfg.seed) else None


def usable_rounds(cfg: RunConfig, work: PriorWork | None, run: int, first: int) -> tuple[list[dict], bool]:
    """A run's checkpointed rounds from round ``first`` + 1 on, short of the final round, and whether
    they had to be dropped because they were run with other settings."""
    schedule = cfg.schedule
    records = (work.rounds.get(run, []) if work else [])[: len(schedule) - 1 - first]
    expected = [(k, cfg.seed, cfg.shuffle, cfg.pool) for k in schedule[first:]]
    if any((rec.get("k"), rec.get("seed"), rec.get("shuffle"), rec.get("pool")) != want
           for rec, want in zip(records, expected)):
        return [], True
    return records, False
