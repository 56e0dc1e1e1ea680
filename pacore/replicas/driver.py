"""The driver of a data-parallel run: it alone holds the pending problems and writes the files.

Replicas (local processes, processes.py, or Ray actors, ray_actors.py) each answer
one call at a time with the events of a slice of their run (worker.py). The driver replays
the events on the results files, then tops the replica up to ``max_problems_in_flight + PREFETCH``
problems, never more than its fair share of the unfinished ones (pending and held, over the live
replicas, rounded up): a replica still loading leaves its share in the queue, not in another's
hands, and one that finishes early takes more as the others' shares shrink.
A replica that is lost hands its problems back to the queue; they continue, on another replica,
from what the driver has of them: recorded runs, round checkpoints and snapshots.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from tqdm import tqdm

from ..config import RunConfig
from ..evaluate.records import bad_line_record, error_record, with_extra
from ..evaluate.summary import write_summary
from ..results.keys import POOL_RUN, pool_key, problem_key, run_key, unit_key
from ..results.preflight import INTERRUPTED, Interrupted, Pending, preflight
from ..results.problems import Problem
from ..results.resume import PriorWork, runs_left
from ..results.sink import FileSink
from .worker import CTRL_C, Reply, Work

PREFETCH = 2  # problems queued in a replica beyond those it runs, so it rarely waits for a round trip
# A problem running on a replica that was lost this often is recorded as failed, not handed on again:
# a problem that kills its replica (a crash, the GPU's memory) must not take every replica down.
MAX_LOSSES = 2


class ReplicaError(RuntimeError):
    """Every replica was lost with problems left; what they finished is saved."""


class Replicas(Protocol):
    """A transport: ``count`` replicas, each started with a call outstanding (its engine loading)."""

    count: int

    def call(self, rank: int, work: list[Work]) -> None:
        """Hand ``work`` to a replica that has no call outstanding; it answers through ``wait``."""

    def wait(self, timeout: float) -> tuple[int, Reply | str] | None:
        """The next answer: (rank, reply), or (rank, why) when the replica was lost; None on timeout."""

    def interrupt(self) -> Iterator[tuple[int, Reply | str]]:
        """Stop every replica, yielding what each still had to say (its snapshots)."""

    def close(self) -> None:
        """Stop the replicas (the run is over) and free what they hold."""


def run_replicated(cfg: RunConfig, start: Callable[[], Replicas], on_reply=None,
                   pending: Pending | None = None) -> dict:
    """Run ``cfg`` on the replicas ``start()`` launches; returns (and writes) the run summary.

    ``pending``: what a preflight found to do, its results lock held (results/preflight.py); without
    it this takes its own. ``on_reply(replicas, rank, reply)`` is called after each answer is written
    (tests kill replicas from it). Raises ReplicaError, after writing the summary, when every replica
    was lost with problems left (``--resume`` completes them).
    """
    if pending is None:
        with preflight(cfg, cfg.engine.max_model_len) as pending:
            return run_replicated(cfg, start, on_reply, pending)
    sink = FileSink(cfg.out_path)
    try:
        driver = _Driver(cfg, pending, sink, on_reply)
        if driver.pending:
            replicas = start()
            try:
                driver.run(replicas)
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the summary of what is done, then the hint's exit
                write_summary(cfg, driver.wall_s(), driver.sessions(), dispatch=driver.report())
                raise
            finally:
                replicas.close()
        summary = write_summary(cfg, driver.wall_s(), driver.sessions(), dispatch=driver.report())
    finally:
        sink.close()
    left = len(driver.pending) + sum(len(a) for a in driver.assigned.values())
    if left:
        detail = "\n".join(f"replica {r}: {why.strip()}" for r, why in sorted(driver.lost.items()))
        raise ReplicaError(f"all {len(driver.lost)} replicas were lost with {left} problems left; the problems "
                           f"they finished are in {cfg.out_path}; run again with --resume to complete the "
                           f"rest.\n{detail}")
    return summary


class _Driver:
    def __init__(self, cfg: RunConfig, pending: Pending, sink: FileSink, on_reply):
        self.cfg, self.prior, self.sink, self.on_reply = cfg, pending.prior, sink, on_reply
        self.target = cfg.max_problems_in_flight + PREFETCH
        for item in pending.todo:
            if not isinstance(item, Problem):  # no replica needed: keyed by its line, as the runner does
                self.sink.record(bad_line_record(item))
                print(f"pacore: skipped {item.error}", file=sys.stderr)
        self.pending: deque[Problem] = deque(x for x in pending.todo if isinstance(x, Problem))
        self.assigned: dict[int, dict[str, Problem]] = {}  # rank -> its problems not yet closed
        self.suspects: dict[int, set[str]] = {}  # rank -> problems it had started at its latest answer
        self.calling: set[int] = set()  # ranks with a call outstanding
        self.ready: set[int] = set()
        self.lost: dict[int, str] = {}
        self.stats: dict[int, dict] = {}  # rank -> its latest session stats
        self.handed = Counter()  # rank -> problems handed to it
        self.losses = Counter()  # problem key -> replicas lost while holding it
        self.reassigned = 0
        self.recorded: set[str] = set()  # run keys written this session
        self.duplicates = 0
        self.started = self.finished = None

    def run(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self.assigned = {r: {} for r in range(replicas.count)}
        self.suspects = {r: set() for r in range(replicas.count)}
        self.calling = set(range(replicas.count))
        runs = sum(len(runs_left(self.cfg, self.prior.get(p.key))) for p in self.pending)
        self.bar = tqdm(total=runs, unit="run", desc="pacore", disable=not self.cfg.show_progress, dynamic_ncols=True)
        try:
            with _sigint_sets() as stop:  # a Ctrl-C must not tear a message or a write in half
                while (self.pending or any(self.assigned.values())) and len(self.lost) < replicas.count:
                    if stop.is_set():
                        raise KeyboardInterrupt
                    answer = replicas.wait(timeout=0.5)
                    if answer is not None:
                        self._handle(*answer)
                        self._dispatch()
        except KeyboardInterrupt:
            for rank, answer in replicas.interrupt():  # what they held in flight, for --resume
                if isinstance(answer, Reply):
                    self._apply(rank, answer)
            print(f"\n{INTERRUPTED.format(out=self.cfg.out_path)}", file=sys.stderr)
            raise Interrupted from None
        finally:
            self.finished = time.perf_counter()
            self.bar.close()

    # -- answers -----------------------------------------------------------------------------
    def _handle(self, rank: int, answer: Reply | str) -> None:
        self.calling.discard(rank)
        if isinstance(answer, Reply):
            self._apply(rank, answer)
            if answer.error == CTRL_C:  # the terminal's Ctrl-C reached the replica first
                raise KeyboardInterrupt
            if answer.error is None:
                if self.on_reply is not None:
                    self.on_reply(self.replicas, rank, answer)
                return
            self._lose(rank, answer.error, told=True)
            return
        self._lose(rank, answer)

    def _apply(self, rank: int, reply: Reply) -> None:
        self.suspects[rank] = set(reply.started)
        if reply.stats is not None:
            self.stats[rank] = reply.stats
            if rank not in self.ready and reply.error is None:
                self.ready.add(rank)
                self.started = self.started or time.perf_counter()
        for name, args in reply.events:
            if name == "record":
                self._record(*args)
            elif name == "closed":
                self.assigned.get(rank, {}).pop(args[0], None)
            elif name == "snapshot":
                try:
                    self.sink.snapshot(*args)
                except OSError as e:  # a full disk: a snapshot is a shortcut, not a result (runner.step)
                    print(f"pacore: could not save a snapshot of a round in flight: {e}; the next snapshot "
                          f"tries again", file=sys.stderr)
            else:
                if name == "checkpoint":
                    self._checkpointed(*args)
                getattr(self.sink, name)(*args)  # drop_snapshot, checkpoint

    def _record(self, rec: dict) -> None:
        run = rec.get("run", 0)
        key = run_key(rec["request_id"], run)
        if key in self.recorded:  # a safety net: a lost replica's problem is never rerun past its records
            self.duplicates += 1
            return
        self.sink.record(rec)
        self.recorded.add(key)
        self.prior.setdefault(problem_key(rec["request_id"]), PriorWork()).runs_done.add(run)
        self.bar.update(1)

    def _checkpointed(self, rec: dict) -> None:
        """Keep the driver's view of the problem current, so a reassigned run continues from here."""
        work = self.prior.setdefault(problem_key(rec["request_id"]), PriorWork())
        if rec["run"] == POOL_RUN:
            work.pool = rec
        else:  # a run started over (other settings on disk) replaces its rounds from this one on
            work.rounds[rec["run"]] = [r for r in work.rounds.get(rec["run"], []) if r["round"] < rec["round"]] + [rec]

    def _lose(self, rank: int, why: str, told: bool = False) -> None:
        """``told``: its last answer named the problems it had started when it failed."""
        self.lost[rank] = why
        orphans = list(self.assigned.pop(rank, {}).values())
        self.assigned[rank] = {}
        # Since its latest answer it ran those it had started and at most max_problems_in_flight more: the
        # first of its queue (those it held in the order handed), as slots freed. The rest did not cause the loss.
        queued = [p.key for p in orphans if p.key not in self.suspects[rank]]
        blamed = self.suspects[rank] | set(queued[:0 if told else self.cfg.max_problems_in_flight])
        for problem in reversed(orphans):  # to the front, in their order
            self.losses[problem.key] += problem.key in blamed
            if self.losses[problem.key] >= MAX_LOSSES:
                self._give_up(problem, why)
            else:
                self.pending.appendleft(problem)
                self.reassigned += 1
        print(f"pacore: replica {rank} was lost ({_gist(why)}); the {len(orphans)} problems it held go back "
              f"to the queue ({self.replicas.count - len(self.lost)} replicas left)", file=sys.stderr)

    def _give_up(self, problem: Problem, why: str) -> None:
        error = (f"its replica was lost {MAX_LOSSES} times while running it (last: {_gist(why)}); "
                 f"--resume runs it again")
        print(f"pacore: problem {problem.id!r} failed: {error}", file=sys.stderr)
        for run in runs_left(self.cfg, self.prior.get(problem.key)):
            self._record(with_extra(error_record(problem.id, run, error, problem.line_no), problem.extra))

    # -- handing out problems ----------------------------------------------------------------
    def _dispatch(self) -> None:
        for rank in range(self.replicas.count):
            if rank in self.lost or rank in self.calling or rank not in self.ready:
                continue
            work = self._fill(rank)
            if work or self.assigned[rank]:
                self.replicas.call(rank, work)
                self.calling.add(rank)

    def _fill(self, rank: int) -> list[Work]:
        live = self.replicas.count - len(self.lost)
        unfinished = len(self.pending) + sum(len(held) for held in self.assigned.values())
        out = []
        room = min(self.target, -(-unfinished // live)) - len(self.assigned[rank])
        for _ in range(min(room, len(self.pending))):
            problem = self.pending.popleft()
            self.assigned[rank][problem.key] = problem
            self.handed[rank] += 1
            out.append(Work(problem, self.prior.get(problem.key), self._snapshots(problem)))
        return out

    def _snapshots(self, problem: Problem) -> dict[tuple[str, int], dict]:
        """The snapshots on disk of the problem's runs left (and pool), any round: the replica uses
        those that match what it runs (results/snapshots.py)."""
        units = [unit_key(problem.key, run) for run in runs_left(self.cfg, self.prior.get(problem.key))]
        if self.cfg.pool:
            units.append(pool_key(problem.key))
        found = {}
        for unit in units:
            for round_no in range(1, len(self.cfg.schedule) + 1):
                rec = self.sink.load_snapshot(unit, round_no)
                if rec is not None:
                    found[(unit, round_no)] = rec
        return found

    # -- the summary -------------------------------------------------------------------------
    def wall_s(self) -> float:
        """From the first replica ready to the end: decoding, without start-up and model loading."""
        return self.finished - self.started if self.started is not None else 0.0

    def sessions(self) -> list[dict]:
        return [self.stats[r] for r in sorted(self.stats)]

    def report(self) -> dict:
        return {"replicas": len(self.assigned), "ready": len(self.ready),
                "lost": {str(r): _gist(why) for r, why in sorted(self.lost.items())},
                "problems_reassigned": self.reassigned,
                "problems_per_replica": [self.handed[r] for r in range(len(self.assigned))],
                "duplicate_records_dropped": self.duplicates}


def _gist(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "no reason given"  # a traceback's last line names the error


@contextmanager
def _sigint_sets() -> Iterator[threading.Event]:
    """While inside, SIGINT sets the yielded event instead of raising wherever the driver happens to be."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, old)
