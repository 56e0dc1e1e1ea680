"""Data parallelism: one engine replica per GPU, the problems dealt round-robin between them.

PaCoRe problems are independent and a PaCoRe-8B replica fits one GPU, so a node scales by
replicas, not by splitting the model. Every replica appends to the same results file (one locked
write per problem), so ``--resume`` works unchanged, and a replica that fails loses only the
problems it had in flight; the parent holds the results file's run lock (pacore/lock.py) for
the whole run and writes the summary once all replicas are done.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait

from .config import RunConfig
from .problems import BadLine, Problem
from .lock import results_lock
from .runner import INTERRUPTED, PaCoReRunner, pending_work, profiled
from .stats import write_summary


class ReplicaError(RuntimeError):
    """One or more replicas failed; the problems they finished are saved."""


def replica_devices(replicas: int) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES value of each replica: one GPU each, or None each on a CPU host."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return [None] * replicas
    if replicas > count:
        raise ValueError(f"--data-parallel {replicas} needs {replicas} GPUs but {count} are visible; "
                         f"use --data-parallel {count} or set CUDA_VISIBLE_DEVICES")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else [str(i) for i in range(count)]
    return ids[:replicas]


def run_data_parallel(cfg: RunConfig, replicas: int, build_llm) -> dict:
    """Run ``cfg`` on ``replicas`` engines (``build_llm(cfg)`` in each); returns the run summary.

    Raises ReplicaError after writing the summary when a replica failed, so the caller can exit
    non-zero while everything the others finished stays in the results file, and ResultsLocked
    (before starting anything) when another run holds the results file.
    """
    if replicas < 1:
        raise ValueError(f"--data-parallel must be at least 1, got {replicas}")
    with results_lock(cfg.out_path):  # a no-op when the CLI already holds it
        return _run(cfg, replicas, build_llm)


def _run(cfg: RunConfig, replicas: int, build_llm) -> dict:
    todo, checkpoints = pending_work(cfg)
    devices = replica_devices(replicas)
    # On a CPU host the replicas split the cores instead of each oversubscribing all of them.
    threads = max(1, (os.cpu_count() or 1) // replicas) if devices[0] is None else 0
    ctx = mp.get_context("spawn")  # a fresh interpreter per replica: CUDA cannot survive a fork
    procs: dict[int, mp.Process] = {}
    reports: dict[int, Connection] = {}
    start = time.perf_counter()
    try:
        for rank in range(replicas):
            shard = todo[rank::replicas]
            if not shard:
                continue
            shard_checkpoints = {x.key: checkpoints[x.key] for x in shard
                                 if isinstance(x, Problem) and x.key in checkpoints}
            reports[rank], child_end = ctx.Pipe(duplex=False)
            with _env("CUDA_VISIBLE_DEVICES", devices[rank]):
                p = ctx.Process(target=_replica, name=f"pacore-replica-{rank}",
                                args=(rank, cfg, shard, shard_checkpoints, threads, build_llm, child_end))
                p.start()
            procs[rank] = p
            child_end.close()  # so the parent's end reads EOF once the replica is gone
        sessions, failures = _collect(procs, reports)
    except KeyboardInterrupt:
        _stop(procs)
        print(f"\n{INTERRUPTED.format(out=cfg.out_path)}", file=sys.stderr)
        raise
    finally:
        for p in procs.values():
            p.join()
    wall = time.perf_counter() - start
    if sessions:  # the replicas' decoding span, without process start-up and model loading
        wall = max(s["finished_at"] for s in sessions.values()) - min(s["started_at"] for s in sessions.values())
    summary = write_summary(cfg, wall, [sessions[r] for r in sorted(sessions)])
    if failures:
        detail = "\n".join(f"replica {r}: {msg.strip()}" for r, msg in sorted(failures.items()))
        raise ReplicaError(f"{len(failures)} of {len(procs)} replicas failed; the problems they finished are "
                           f"in {cfg.out_path}; run again with --resume to complete the rest.\n{detail}")
    return summary


def _collect(procs: dict[int, mp.Process], reports: dict[int, Connection]):
    """One report per replica: (stats, None) or (None, traceback); EOF without one means it was killed."""
    sessions: dict[int, dict] = {}
    failures: dict[int, str] = {}
    rank_of = {conn: rank for rank, conn in reports.items()}
    pending = set(reports.values())
    while pending:
        for conn in wait(list(pending)):
            pending.discard(conn)
            rank = rank_of[conn]
            try:
                stats, error = conn.recv()
            except EOFError:
                procs[rank].join()
                stats, error = None, f"exited with code {procs[rank].exitcode} before reporting"
            if error is None:
                sessions[rank] = stats
            else:
                failures[rank] = error
    return sessions, failures


def _stop(procs: dict[int, mp.Process], grace_s: float = 10.0) -> None:
    """Interrupt the replicas (they unwind and exit cleanly), then kill any that linger."""
    for p in procs.values():
        if p.is_alive():
            os.kill(p.pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for p in procs.values():
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()


def _interrupt_once(signum, frame):
    # A terminal's Ctrl-C reaches the replica and the parent forwards one too: unwind only once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _replica(rank: int, cfg: RunConfig, items: list[Problem | BadLine], checkpoints: dict[str, list[dict]],
             threads: int, build_llm, report: Connection) -> None:
    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        runner = PaCoReRunner(build_llm(cfg), cfg)
        with profiled(runner.llm, cfg.profile_dir and os.path.join(cfg.profile_dir, f"replica{rank}")):
            runner.process(items, checkpoints, f"replica {rank}", rank, interrupt_hint=False)
        report.send((runner.session_stats(), None))
    except KeyboardInterrupt:
        report.send((None, "interrupted"))
        sys.exit(130)
    except BaseException:
        report.send((None, traceback.format_exc(limit=-3)))
        sys.exit(1)


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
