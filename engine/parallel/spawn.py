"""Child processes that share this machine: spawned on a pipe, and how they split its CPU cores.

Used by the tensor-parallel workers (engine/worker/tp_workers.py) and by pacore's local replicas
(pacore/replicas/processes.py). Torch-free until a thread count is set.
"""
from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection


def spawn_on_pipe(target, args: tuple, name: str, daemon: bool) -> tuple[mp.Process, Connection]:
    """Start ``target(*args, conn)`` in a spawned process (a fresh interpreter: CUDA cannot survive a fork)
    and return it with this side's end of a duplex pipe; the child's end is closed here, so this side
    reads EOF once the child is gone."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    p = ctx.Process(target=target, name=name, daemon=daemon, args=(*args, theirs))
    p.start()
    theirs.close()
    return p, ours


def split_threads(total: int, parts: int) -> int:
    """The torch threads each of ``parts`` processes gets when they share ``total`` cores, rather than
    each oversubscribing all of them (at least 1)."""
    return max(1, total // parts)


def use_threads(threads: int | None) -> None:
    """Set this process's torch threads (None or 0: leave torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
