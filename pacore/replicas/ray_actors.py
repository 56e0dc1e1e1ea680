"""Replicas as Ray actors, on the nodes of a Ray cluster: ``pacore run --ray [ADDRESS]``.

Each replica is an actor that asks Ray for its ``--tensor-parallel`` GPUs (Ray sets its
CUDA_VISIBLE_DEVICES) and wraps the same ReplicaWorker as a local replica process. The driver
(replicas/driver.py) stays in the ``pacore run`` process: replies stream the records, checkpoints
and snapshots back to it, so no node needs a shared filesystem, but each node needs this package
installed and the model folder at the same path (the driver ships no weights).
"""
from __future__ import annotations

import time
from collections.abc import Iterator

from engine.parallel.spawn import split_threads

from ..config import RunConfig
from ..results.preflight import Pending
from .driver import Replicas, run_replicated
from .worker import Reply, Work, build_worker

LOCAL = "local"  # `--ray` without an address: start a Ray cluster on this machine for the run


class RayMissing(ImportError):
    """``--ray`` was given but Ray is not installed."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayMissing("--ray needs Ray, which is not installed here: pip install -e '.[ray]' "
                         "(and the same on every node of the cluster)") from None
    return ray


def run_on_ray(cfg: RunConfig, build_llm, address: str = LOCAL, replicas: int | None = None,
               on_reply=None, pending: Pending | None = None) -> dict:
    """Run ``cfg`` on Ray actors (``build_llm(cfg)`` in each); returns the run summary.

    ``address``: LOCAL starts a cluster on this machine; ``auto``, ``host:port`` or ``ray://host:port``
    joins a running one (an already initialized Ray is used as it is). ``replicas`` defaults to the
    cluster's GPUs // tensor-parallel size, or one per node on a cluster without GPUs. ``pending``:
    what a preflight found to do, its lock held (without it the driver takes its own).
    """
    ray = import_ray()
    owns = not ray.is_initialized()
    if owns:
        if address == LOCAL:
            ray.init(include_dashboard=False)
        else:
            ray.init(address=address)
    try:
        count, options, threads = _placement(ray, replicas, cfg.engine.tensor_parallel_size)
        return run_replicated(cfg, lambda: RayReplicas(ray, cfg, build_llm, count, options, threads), on_reply,
                              pending)
    finally:
        if owns:
            ray.shutdown()


def _placement(ray, replicas: int | None, tp: int) -> tuple[int, dict, int]:
    """(replicas, each actor's Ray options, its torch threads), refused when the cluster cannot hold them:
    an actor Ray cannot place would wait forever."""
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if gpus:
        # A replica's T GPUs must sit on one node (its tensor-parallel group talks over NCCL there).
        per_node = [int(n.get("Resources", {}).get("GPU", 0)) for n in nodes]
        slots = sum(g // tp for g in per_node)
        count = replicas or slots
        if count < 1 or count > slots:
            raise ValueError(f"--ray: {replicas or 1} replicas x --tensor-parallel {tp} need {(replicas or 1) * tp} "
                             f"GPUs, {tp} on one node each, but the Ray cluster's nodes have {per_node} GPUs "
                             f"({slots} such replicas fit); use --data-parallel {max(1, slots)} or add nodes "
                             f"(ray start --address=HEAD:6379 on each)")
        return count, {"num_gpus": tp, "num_cpus": 1}, 0
    count = replicas or max(1, len(nodes))
    if count > cpus:
        raise ValueError(f"--ray: {count} CPU replicas need {count} CPUs but the Ray cluster has {cpus}")
    per = split_threads(cpus, count)  # replicas split the cluster's cores; SPREAD puts them on different nodes
    return count, {"num_gpus": 0, "num_cpus": per, "scheduling_strategy": "SPREAD"}, per


class ReplicaActor:
    """A Ray actor around ReplicaWorker (made remote in RayReplicas, as Ray is imported lazily)."""

    def __init__(self, rank: int, cfg: RunConfig, build_llm, threads: int):
        self._worker = build_worker(rank, cfg, build_llm, threads)

    def advance(self, work: list[Work]) -> Reply:
        return self._worker.advance(work)

    def interrupt(self) -> Reply:
        return self._worker.interrupt()

    def close(self) -> None:
        self._worker.close()


class RayReplicas(Replicas):
    """Replicas as Ray actors; ``actors[rank]`` for whoever must kill one (``ray.kill``)."""

    def __init__(self, ray, cfg: RunConfig, build_llm, count: int, options: dict, threads: int):
        self._ray = ray
        self.count = count
        actor = ray.remote(ReplicaActor)
        self.actors = [actor.options(**options).remote(rank, cfg, build_llm, threads) for rank in range(count)]
        self._refs = {rank: a.advance.remote([]) for rank, a in enumerate(self.actors)}  # answers once built
        self._ready: set[int] = set()
        self._gone: set[int] = set()

    def call(self, rank: int, work: list[Work]) -> None:
        self._refs[rank] = self.actors[rank].advance.remote(work)  # a dead actor's ref raises in wait

    def wait(self, timeout: float) -> tuple[int, Reply | str] | None:
        if not self._refs:
            time.sleep(timeout)
            return None
        by_ref = {ref: rank for rank, ref in self._refs.items()}
        done, _ = self._ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        if not done:
            return None
        rank = by_ref[done[0]]
        del self._refs[rank]
        answer = self._get(rank, done[0])
        if isinstance(answer, Reply) and answer.error is None:
            self._ready.add(rank)
        return rank, answer

    def interrupt(self) -> Iterator[tuple[int, Reply | str]]:
        deadline = time.monotonic() + 60.0
        for rank, ref in list(self._refs.items()):  # slices end within seconds; loading engines are dropped
            if rank in self._ready:
                yield rank, self._get(rank, ref, max(1.0, deadline - time.monotonic()))
        self._refs.clear()
        for rank in sorted(self._ready - self._gone):  # what each holds in flight, snapshotted
            yield rank, self._get(rank, self.actors[rank].interrupt.remote(), max(1.0, deadline - time.monotonic()))

    def close(self) -> None:
        closing = [self.actors[r].close.remote() for r in sorted(self._ready - self._gone) if r not in self._refs]
        try:
            if closing:
                self._ray.wait(closing, num_returns=len(closing), timeout=30.0)  # profiles flushed
        finally:
            for rank in range(self.count):
                self._kill(rank)

    def _get(self, rank: int, ref, timeout: float | None = None) -> Reply | str:
        try:
            answer = self._ray.get(ref, timeout=timeout)
        except Exception as e:  # RayActorError (it died), GetTimeoutError, a lost node...
            self._kill(rank)
            return f"{type(e).__name__}: {e}"
        if answer.error is not None:
            self._kill(rank)
        return answer

    def _kill(self, rank: int) -> None:
        if rank not in self._gone:
            self._gone.add(rank)
            try:
                self._ray.kill(self.actors[rank])
            except Exception:  # already gone
                pass
