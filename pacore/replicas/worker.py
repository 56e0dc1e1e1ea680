"""One engine replica's side of a data-parallel run: problems in, events out, one slice at a time.

The driver (driver.py) calls ``advance`` with the problems it hands this replica; the
replica runs engine steps until it has something to report (a record, a round checkpoint, a
snapshot, a problem closed) or ``slice_s`` passes, and answers with those events and its session
stats. The engine keeps its requests between calls. The same worker serves a local process
(processes.py) and a Ray actor (ray_actors.py): only the transport differs.
"""
from __future__ import annotations

import dataclasses
import os
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field

from engine.profiler import profiled
from engine.parallel.spawn import use_threads

from ..config import RunConfig
from ..results.problems import Problem
from ..results.resume import PriorWork
from ..results.sink import Event, EventSink
from ..runner import PaCoReRunner

CTRL_C = "interrupted"  # Reply.error of a replica stopped by Ctrl-C (after snapshotting)


@dataclass(slots=True)
class Work:
    """One problem handed to a replica, with what is done of it: runs, checkpointed rounds, snapshots."""

    problem: Problem
    prior: PriorWork | None = None
    snapshots: dict[tuple[str, int], dict] = field(default_factory=dict)  # (unit key, round) -> record


@dataclass(slots=True)
class Reply:
    """A replica's answer: its events in order, its session stats, and why it stops, if it does."""

    events: list[Event]
    stats: dict | None  # None when the engine could not even be built
    error: str | None = None  # a traceback, or CTRL_C; the replica is gone after sending it
    started: list[str] = field(default_factory=list)  # problems begun and not closed: suspects if it dies


class ReplicaWorker:
    """A PaCoReRunner whose output goes back to the driver instead of into files."""

    def __init__(self, llm, cfg: RunConfig, profile_dir: str | None = None, slice_s: float = 2.0):
        self._sink = EventSink()
        # The driver shows the one progress bar; a replica's would interleave with it.
        self.runner = PaCoReRunner(llm, dataclasses.replace(cfg, show_progress=False), self._sink)
        self.runner.begin()
        self._slice_s = slice_s
        self._stack = ExitStack()
        self._stack.enter_context(profiled(llm, profile_dir, cfg.profile_trace_steps))

    def advance(self, work: list[Work]) -> Reply:
        """Take ``work``, then step until there is something to report; a failure is the reply's error."""
        try:
            for w in work:
                self._sink.shipped.update(w.snapshots)
                self.runner.add(w.problem, w.prior)
            deadline = time.monotonic() + self._slice_s
            while self.runner.busy and not self._sink.events and time.monotonic() < deadline:
                self.runner.step()
        except BaseException as e:
            self.runner.snapshot_safely()  # so another replica, or --resume, continues these tokens
            return self._reply(CTRL_C if isinstance(e, KeyboardInterrupt) else traceback.format_exc(limit=-3))
        return self._reply()

    def interrupt(self) -> Reply:
        """Snapshot every round in flight and stop (Ctrl-C reached the driver, not this replica)."""
        self.runner.snapshot_safely()
        return self._reply(CTRL_C)

    def close(self) -> None:
        self.runner.end()
        self._stack.close()

    def _reply(self, error: str | None = None) -> Reply:
        return Reply(self._sink.take(), self.runner.session_stats(), error, self.runner.started)


def build_worker(rank: int, cfg: RunConfig, build_llm, threads: int) -> ReplicaWorker:
    """Replica ``rank``'s worker, in its own process or actor: ``build_llm(cfg)`` on ``threads`` torch
    threads (0: torch's default), profiled into ``DIR/replicaR`` with ``--profile DIR``."""
    use_threads(threads)
    profile = cfg.profile_dir and os.path.join(cfg.profile_dir, f"replica{rank}")
    return ReplicaWorker(build_llm(cfg), cfg, profile)
