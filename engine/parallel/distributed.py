"""Tensor parallelism's communicator and the Megatron split of one checkpoint across ranks.

Each rank holds a slice of every layer: query heads, KV heads, MLP columns and vocabulary rows.
Column-parallel projections (q|k|v, gate|up) need no communication; the row-parallel ones (o, down)
end in one all-reduce each, and so does the vocabulary-parallel embedding. The LM head's slices are
gathered so rank 0 samples from whole logits.

The group is a private ProcessGroup object, not torch.distributed's global default group, so a
process can hold several engines (tests do) and a user's own torch.distributed setup is untouched.
"""
from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.config import ModelConfig

_TIMEOUT = datetime.timedelta(minutes=30)  # a prefill of 131k tokens on one step is legitimately long


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class TPGroup:
    """This rank's place in a tensor-parallel group; ``pg`` is None when size == 1."""

    rank: int = 0
    size: int = 1
    pg: object = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.pg.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dim (the vocabulary slices of the logits)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.pg.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)

    def abort(self) -> None:
        """Break any collective in flight (a peer died: NCCL would otherwise wait forever)."""
        if self.pg is not None:
            try:
                self.pg.abort()
            except RuntimeError:
                pass


def connect(port: int, rank: int, size: int, device: torch.device) -> TPGroup:
    """Join the group that rank 0 hosts on 127.0.0.1:port: NCCL on CUDA, gloo on CPU."""
    if size == 1:
        return TPGroup()
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=datetime.timedelta(seconds=120))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = _TIMEOUT
        pg = dist.ProcessGroupNCCL(store, rank, size, options)
        # Bind the communicator to this rank's device now (init_process_group(device_id=...) does the
        # same), not lazily inside the first collective: a failing NCCL setup shows here, at LLM(), and
        # the communicator exists before any CUDA graph captures an all-reduce (ncclCommInitRank
        # cannot run under capture). PyTorch >= 2.4; before, the graphs' warm-up creates it.
        if hasattr(pg, "eager_connect_single_device"):
            pg.eager_connect_single_device(device)
    else:
        pg = dist.ProcessGroupGloo(store, rank, size, _TIMEOUT)
    return TPGroup(rank, size, pg)


def check_graph_capture_env() -> None:
    """Refuse to capture all-reduces into CUDA graphs under NCCL blocking waits: ranks are reported to
    hang for good before the capture starts (waiting for pending NCCL work, with no timeout)."""
    for name in ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"):
        if os.environ.get(name, "0").strip().lower() not in ("", "0", "false"):
            raise RuntimeError(f"{name}={os.environ[name]} makes capturing the tensor-parallel decode graphs hang; "
                               f"unset it, or run without CUDA graphs: LLM(..., enforce_eager=True), --enforce-eager")


@dataclass(slots=True, frozen=True)
class Shard:
    """Which slice of the checkpoint one rank holds (all ranges are [start, end) in units named)."""

    rank: int
    size: int
    heads: tuple[int, int]      # query heads
    kv_heads: tuple[int, int]   # KV heads: a replica of one head when size exceeds their count
    ffn: tuple[int, int]        # intermediate (MLP) columns
    vocab: tuple[int, int]      # vocabulary rows held (the last rank's may run past vocab_size: padding)

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def ffn_size(self) -> int:
        return self.ffn[1] - self.ffn[0]

    @property
    def vocab_size(self) -> int:
        return self.vocab[1] - self.vocab[0]


def check_divisible(cfg: ModelConfig, size: int) -> None:
    """Raise ValueError, naming the sizes that would work, when ``size`` cannot split the model."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {size!r}")
    kv = cfg.num_kv_heads
    ok = (cfg.num_heads % size == 0 and cfg.intermediate_size % size == 0
          and (kv % size == 0 or size % kv == 0))
    if not ok:
        sizes = [n for n in range(1, cfg.num_heads + 1) if cfg.num_heads % n == 0
                 and cfg.intermediate_size % n == 0 and (kv % n == 0 or n % kv == 0)]
        raise ValueError(
            f"tensor_parallel_size={size} does not divide {cfg.path.name}: {cfg.num_heads} attention heads, "
            f"{kv} KV heads and an MLP of {cfg.intermediate_size} must each split evenly (KV heads may "
            f"instead be replicated when the size is a multiple of them); sizes that work: {sizes}")


def shard_of(cfg: ModelConfig, rank: int, size: int) -> Shard:
    check_divisible(cfg, size)
    heads = cfg.num_heads // size
    kv = cfg.num_kv_heads
    if kv >= size:
        kv_heads = (rank * kv // size, (rank + 1) * kv // size)
    else:  # more ranks than KV heads: each rank keeps the one head its query heads read (vLLM's way)
        first = rank * kv // size
        kv_heads = (first, first + 1)
    ffn = cfg.intermediate_size // size
    vocab = -(-cfg.vocab_size // size)
    return Shard(rank, size, (rank * heads, (rank + 1) * heads), kv_heads, (rank * ffn, (rank + 1) * ffn),
                 (rank * vocab, (rank + 1) * vocab))


def whole(cfg: ModelConfig) -> Shard:
    return shard_of(cfg, 0, 1)
