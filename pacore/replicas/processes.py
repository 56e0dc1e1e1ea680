"""Data parallelism on one machine: engine replicas in local processes, fed by the driver.

PaCoRe problems are independent, so a node scales by replicas: ``--data-parallel D`` runs D
engines, each on ``--tensor-parallel T`` GPUs of its own. The parent process is the driver
(replicas/driver.py): it hands problems to whichever replica has room and alone writes the results
file, the round checkpoints and the snapshots, under the run lock it holds (results/lock.py), so
``--resume`` works unchanged. Each replica talks to it over one pipe (replicas/worker.py).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait

from engine.parallel.spawn import spawn_on_pipe, split_threads

from ..config import RunConfig
from ..results.preflight import Pending
from .driver import Replicas, run_replicated
from .worker import CTRL_C, Reply, Work, build_worker


def replica_devices(replicas: int, tensor_parallel: int = 1) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES value of each replica: GPUs [r*T, (r+1)*T) of those visible, or None
    each on a CPU host."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return [None] * replicas
    need = replicas * tensor_parallel
    if need > count:
        flags = f"--data-parallel {replicas}" + (f" --tensor-parallel {tensor_parallel}" if tensor_parallel > 1 else "")
        raise ValueError(f"{flags} needs {need} GPUs but {count} are visible; use fewer replicas "
                         f"(--data-parallel {max(1, count // tensor_parallel)}) or set CUDA_VISIBLE_DEVICES")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(count)]
    return [",".join(ids[r * tensor_parallel:(r + 1) * tensor_parallel]) for r in range(replicas)]


def run_data_parallel(cfg: RunConfig, replicas: int, build_llm, on_reply=None,
                      pending: Pending | None = None) -> dict:
    """Run ``cfg`` on ``replicas`` engines (``build_llm(cfg)`` in each process); returns the run summary.

    Each replica takes ``cfg.engine.tensor_parallel_size`` GPUs. ``pending``: what a preflight found to
    do, its lock held (without it the driver takes its own). Raises ReplicaError (after writing the
    summary) when every replica was lost with problems left, ValueError when the GPUs are too few, and
    ResultsLocked (before starting anything) when another run holds the results file.
    """
    if replicas < 1:
        raise ValueError(f"--data-parallel must be at least 1, got {replicas}")
    devices = replica_devices(replicas, cfg.engine.tensor_parallel_size)
    return run_replicated(cfg, lambda: ProcessReplicas(cfg, build_llm, devices), on_reply, pending)


class ProcessReplicas(Replicas):
    """Replicas in spawned processes, one duplex pipe each; ``processes[rank]`` for whoever must kill one."""

    def __init__(self, cfg: RunConfig, build_llm, devices: list[str | None]):
        self.count = len(devices)
        # On a CPU host the replicas split the cores (OMP_NUM_THREADS, `pacore run --threads`, if set) instead
        # of each oversubscribing all of them.
        omp = os.environ.get("OMP_NUM_THREADS", "")
        cores = int(omp) if omp.isdigit() and int(omp) > 0 else os.cpu_count() or 1
        threads = split_threads(cores, self.count) if devices[0] is None else 0
        self.processes: list[mp.Process] = []
        self._conns: list[Connection] = []
        self._calling: set[int] = set(range(self.count))  # each answers first once its engine is built
        self._lost: list[tuple[int, str]] = []  # replicas found gone while handing them work
        try:
            for rank, device in enumerate(devices):
                with _env("CUDA_VISIBLE_DEVICES", device):
                    # not daemonic: a tensor-parallel engine starts worker processes of its own
                    p, conn = spawn_on_pipe(_serve, (rank, cfg, build_llm, threads), f"pacore-replica-{rank}",
                                            daemon=False)
                self.processes.append(p)
                self._conns.append(conn)
        except BaseException:  # e.g. Ctrl-C while starting: no one would hold these to stop them
            for p in self.processes:
                p.kill()
                p.join()
            raise

    def call(self, rank: int, work: list[Work]) -> None:
        try:
            self._conns[rank].send(work)
        except OSError:  # the pipe is broken: the replica is gone
            self._lost.append((rank, self._why(rank)))
            return
        self._calling.add(rank)

    def wait(self, timeout: float) -> tuple[int, Reply | str] | None:
        if self._lost:
            return self._lost.pop(0)
        by_conn = {self._conns[r]: r for r in self._calling}
        ready = wait(list(by_conn), timeout)
        if not ready:
            return None
        rank = by_conn[ready[0]]
        self._calling.discard(rank)
        try:
            answer = self._conns[rank].recv()
        except (EOFError, OSError):
            return rank, self._why(rank)
        if answer.error is not None:
            self.processes[rank].join(10)  # it exits after saying why
        return rank, answer

    def interrupt(self) -> Iterator[tuple[int, Reply | str]]:
        for p in self.processes:  # a terminal's Ctrl-C reached them already; a second one is ignored
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 60.0
        for rank in range(self.count):  # all each sends until it exits: its last replies, its snapshots
            conn = self._conns[rank]
            while conn.poll(max(0.0, deadline - time.monotonic())):
                try:
                    yield rank, conn.recv()
                except (EOFError, OSError):
                    break

    def close(self) -> None:
        for rank, p in enumerate(self.processes):
            if rank in self._calling:  # still loading its engine: nothing to save
                p.kill()
            elif p.is_alive():
                try:
                    self._conns[rank].send(None)  # stop: flush the profile and exit
                except OSError:
                    pass
        deadline = time.monotonic() + 30.0
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():  # stuck
                p.kill()
                p.join()
        for conn in self._conns:
            conn.close()

    def _why(self, rank: int) -> str:
        p = self.processes[rank]
        p.join(10)
        if p.exitcode is None:
            p.kill()
            return "stopped answering"
        if p.exitcode < 0:
            return f"killed by signal {signal.Signals(-p.exitcode).name}"
        return f"exited with code {p.exitcode} before reporting"


def _serve(rank: int, cfg: RunConfig, build_llm, threads: int, conn: Connection) -> None:
    """A replica process: build the engine, then answer the driver's calls until told to stop."""
    signal.signal(signal.SIGINT, _interrupt_once)
    worker = None
    try:
        worker = build_worker(rank, cfg, build_llm, threads)
        work: list[Work] | None = []
        while work is not None:
            reply = worker.advance(work)
            _send(conn, reply)
            if reply.error is not None:
                sys.exit(130 if reply.error == CTRL_C else 1)
            work = conn.recv()
        worker.close()
    except KeyboardInterrupt:  # waiting for the driver, or still loading
        _send(conn, worker.interrupt() if worker is not None else Reply([], None, CTRL_C))
        sys.exit(130)
    except EOFError:  # the driver is gone: nobody to report to
        sys.exit(1)
    except Exception:
        _send(conn, Reply([], None, traceback.format_exc(limit=-3)))
        sys.exit(1)


def _send(conn: Connection, obj) -> None:
    """Send a whole message: a Ctrl-C arriving meanwhile waits, so the pipe never holds half of one."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        conn.send(obj)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _interrupt_once(signum, frame):
    # A terminal's Ctrl-C reaches the replica and the driver forwards one too: unwind only once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextmanager
def _env(name: str, value: str | None):
    """Set an environment variable while a child is spawned (it inherits the environment)."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
