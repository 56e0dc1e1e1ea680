"""The worker ranks of a tensor-parallel engine: processes that only run the model.

Rank 0 is the LLM's own process: it schedules, samples and owns the block manager; its ModelRunner
prepares each step's inputs and sends them down a pipe to ranks 1..N-1, then all ranks run their
shard together. Workers are daemonic children started with spawn (CUDA cannot survive a fork);
they exit when told to, when rank 0's end of the pipe closes (rank 0 died), or on their own error.
A watchdog thread on rank 0 notices a worker's death at once and aborts the process group, so a
collective in flight fails instead of waiting forever (NCCL would).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait

import torch

from engine.parallel.distributed import TPGroup, check_divisible, connect, free_port, shard_of
from engine.worker.model_runner import ModelRunner
from engine.parallel.spawn import spawn_on_pipe, split_threads, use_threads


def start_ranks(runner_kwargs: dict, size: int, device: torch.device) -> ModelRunner:
    """Rank 0's ModelRunner; with size > 1, the worker ranks are started and joined to it first."""
    if size == 1:
        return ModelRunner(**runner_kwargs, device=device)
    cfg = runner_kwargs["cfg"]
    check_divisible(cfg, size)
    devices, threads = [device] * size, None
    if device.type == "cuda":
        first = device.index or 0
        if first + size > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size={size} from {device} needs GPUs {first}..{first + size - 1} but "
                             f"{torch.cuda.device_count()} are visible; lower it or set CUDA_VISIBLE_DEVICES")
        devices = [torch.device("cuda", first + r) for r in range(size)]
    else:  # ranks on one CPU split this process's threads rather than each oversubscribing the cores
        threads = split_threads(torch.get_num_threads(), size)
        use_threads(threads)
    port = free_port()
    workers = TPWorkers(size, port, runner_kwargs, devices, threads)
    try:
        workers.tp = tp = connect(port, 0, size, devices[0])  # NCCL needs an indexed device: cuda:N
        return ModelRunner(**runner_kwargs, device=device, shard=shard_of(cfg, 0, size), tp=tp, workers=workers)
    except BaseException as e:
        dead = workers.dead
        workers.shutdown()
        if dead:
            raise WorkerDied(dead) from e
        raise


class WorkerDied(RuntimeError):
    """A tensor-parallel worker is gone; the engine cannot run another step."""


class TPWorkers:
    def __init__(self, size: int, port: int, runner_kwargs: dict, devices: list[torch.device],
                 threads: int | None):
        self.procs: list[mp.Process] = []
        self.conns: list[Connection] = []
        for rank in range(1, size):  # rank 0 reads EOF on a worker's pipe once the worker is gone
            p, conn = spawn_on_pipe(_worker_main, (rank, size, port, runner_kwargs, devices[rank], threads),
                                    f"pacore-tp-rank{rank}", daemon=True)
            self.procs.append(p)
            self.conns.append(conn)
        self.tp: TPGroup | None = None  # rank 0's group, once joined: what the watchdog aborts
        self.dead: str | None = None
        self._closing = False
        threading.Thread(target=self._watch, name="pacore-tp-watchdog", daemon=True).start()

    def _watch(self) -> None:
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs, start=1)}
        ready = wait(list(sentinels))
        if self._closing:
            return
        rank = sentinels[ready[0]]
        p = self.procs[rank - 1]
        p.join()
        code = p.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        reason = self._last_words(rank)
        self.dead = (f"tensor-parallel worker rank {rank} (pid {p.pid}) {how}{reason}; this LLM cannot run "
                     "another step: create a new one (a StepError carries the tokens its requests had)")
        if self.tp is not None:
            self.tp.abort()

    def _last_words(self, rank: int) -> str:
        conn = self.conns[rank - 1]
        try:
            if conn.poll():
                ok, value = pickle.loads(conn.recv_bytes())
                if not ok:
                    return f" after an error:\n{value}"
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        return ""

    def check(self) -> None:
        if self.dead:
            raise WorkerDied(self.dead)

    def call(self, method: str, *args, wait: bool = True) -> list:
        """Run ``ModelRunner.method(*args)`` on every worker; with wait, return their results."""
        self.check()
        message = pickle.dumps((method, args, wait))
        try:
            for conn in self.conns:
                conn.send_bytes(message)
            return [self._reply(conn) for conn in self.conns] if wait else []
        except (EOFError, OSError) as e:  # a pipe broke: a worker is going, let the watchdog name it
            raise self.explain(e) from None

    def explain(self, error: Exception, grace_s: float = 3.0) -> WorkerDied:
        """What to raise when a pipe to a worker broke or rank 0's part of a step failed: the group is
        out of step for good.

        If a worker died (its socket closes before the watchdog names it) say which; otherwise rank
        0 failed alone and the workers wait in a collective that will never complete: stop them."""
        deadline = time.monotonic() + grace_s
        while not self.dead and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.dead:
            self.dead = (f"rank 0 failed in the middle of a tensor-parallel step ({type(error).__name__}: {error}), "
                         "leaving the ranks out of step; this LLM cannot run another step: create a new one")
            if self.tp is not None:
                self.tp.abort()
            self.shutdown(timeout=2.0)
        return WorkerDied(self.dead)

    def _reply(self, conn: Connection):
        ok, value = pickle.loads(conn.recv_bytes())
        if not ok:
            raise RuntimeError(f"a tensor-parallel worker failed:\n{value}")
        return value

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the workers (idempotent); any that do not exit in time are killed."""
        if self._closing:
            return
        self._closing = True
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(("shutdown", (), False)))
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()


def _worker_main(rank: int, size: int, port: int, runner_kwargs: dict, device: torch.device, threads: int | None,
                 conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is rank 0's to handle
    try:
        use_threads(threads)
        tp = connect(port, rank, size, device)
        runner = ModelRunner(**runner_kwargs, device=device, shard=shard_of(runner_kwargs["cfg"], rank, size), tp=tp)
        while True:
            try:
                method, args, reply = pickle.loads(conn.recv_bytes())
            except EOFError:
                return  # rank 0 is gone
            if method == "shutdown":
                return
            result = getattr(runner, method)(*args)
            if reply:
                conn.send_bytes(pickle.dumps((True, result)))
    except BaseException:
        try:
            conn.send_bytes(pickle.dumps((False, traceback.format_exc())))
        finally:
            os._exit(1)  # skip interpreter teardown: a collective may still hold threads
