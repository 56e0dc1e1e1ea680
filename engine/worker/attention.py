"""Batch attention metadata and the choice of kernels (torch references or Triton).

The layout of the cache and the meaning of every field below is in engine/worker/kv_cache.py.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from pacore_kernels.block_select import select_by_importance


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor                 # [T] int64, where each new token's K/V goes
    num_prefill_tokens: int                    # tokens [0, P) are prefill chunks, [P, T) decodes
    prefill_cu_seqlens_q: torch.Tensor | None = None
    prefill_seq_lens: torch.Tensor | None = None
    prefill_block_tables: torch.Tensor | None = None
    decode_seq_lens: torch.Tensor | None = None
    decode_block_tables: torch.Tensor | None = None
    decode_cu_seqlens_q: torch.Tensor | None = None  # set: verify rows, several queries each (engine/worker/kv_cache.py)
    decode_max_query_len: int = 1                    # host-side bound on a row's queries
    decode_start_lens: torch.Tensor | None = None    # set: a self-drafting step's window starts (int32 [B])
    decode_sink_lens: torch.Tensor | None = None     # and its sink [0, sink) before the window
    decode_select: tuple[int, int, int] | None = None  # set: a sparse draft step's (sink, top-k, recent) blocks
    # set (selection "verify"), fp32 [layers, B, W]: a verify step's block importance, written by attention;
    # a draft step's, read to choose its blocks (pacore_kernels/block_importance.py)
    block_importance: torch.Tensor | None = None
    key_bounds: torch.Tensor | None = None     # set: every block's key min/max per layer (sparse self-drafting)
    group_starts: torch.Tensor | None = None   # set: decode rows use cascade (prefix-shared) attention
    group_prefix_lens: torch.Tensor | None = None
    max_group_size: int | None = None          # host-side bound, so kernels need no device read
    plan: list | None = None                   # batch-invariant attention's index plan (first layer)
    work_plans: dict = field(default_factory=dict)  # kernels' per-step plans: built by layer 1, reused


_OPS = ("store_kvcache", "paged_decode", "cascade_decode", "prefill_attention", "rmsnorm", "rope",
        "silu_and_mul", "select_blocks")
_MODULES = {op: op for op in _OPS} | {"silu_and_mul": "activation", "select_blocks": "block_select"}


@dataclass(slots=True, frozen=True)
class Backend:
    name: str
    store_kvcache: Callable
    paged_decode: Callable
    cascade_decode: Callable
    prefill_attention: Callable
    rmsnorm: Callable
    rope: Callable
    silu_and_mul: Callable
    select_blocks: Callable

    def attention(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scale: float = 1.0,
                  v_scale: float = 1.0, bounds: torch.Tensor | None = None,
                  importance: torch.Tensor | None = None) -> torch.Tensor:
        """Store the new K/V, then attend; k_scale / v_scale: an FP8 cache's scales for this layer;
        bounds: its blocks' key bounds (a sparse draft step chooses its blocks by them); importance
        [B, W] fp32: this layer's block importance, which a verify step writes and a sparse draft step
        (selection "verify") chooses its blocks by."""
        kv_scales = dict(k_scale=k_scale, v_scale=v_scale)
        self.store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping, **kv_scales)
        num_p = meta.num_prefill_tokens
        prefill = decode = None
        if num_p:
            prefill = self.prefill_attention(q[:num_p], k_cache, v_cache, meta.prefill_block_tables,
                                             meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, scale,
                                             work_plans=meta.work_plans, k=k[:num_p], v=v[:num_p], **kv_scales)
        if num_p < q.shape[0]:
            decode = self._decode(q[num_p:], k_cache, v_cache, meta, scale, kv_scales, bounds, importance)
        if prefill is None or decode is None:
            return prefill if decode is None else decode
        return torch.cat([prefill, decode])

    def _decode(self, qd, k_cache, v_cache, meta: AttentionMetadata, scale: float, kv_scales: dict,
                bounds: torch.Tensor | None, importance: torch.Tensor | None) -> torch.Tensor:
        if meta.decode_select is not None and importance is not None:  # the blocks the last verify attended to
            tables, lens, start, sink = select_by_importance(importance, meta.decode_block_tables, meta.decode_seq_lens,
                                                             k_cache.shape[1], *meta.decode_select)
            return self.paged_decode(qd, k_cache, v_cache, tables, lens, scale, start_lens=start, sink_lens=sink,
                                     **kv_scales)
        if meta.decode_select is not None:  # a sparse draft step: the sink, the top-scoring blocks, the window
            tables, lens = self.select_blocks(qd, bounds, meta.decode_block_tables, meta.decode_seq_lens,
                                              k_cache.shape[1], *meta.decode_select)
            return self.paged_decode(qd, k_cache, v_cache, tables, lens, scale, **kv_scales)
        if meta.decode_cu_seqlens_q is not None:  # each KV block read once for all of a row's queries
            kv_scales = kv_scales | dict(cu_seqlens_q=meta.decode_cu_seqlens_q,
                                         max_query_len=meta.decode_max_query_len)
            if importance is not None:  # a verify step: what its queries attended to, for the next drafts
                kv_scales["importance"] = importance
        if meta.decode_start_lens is not None:  # a draft step: the sink and the recent window only
            kv_scales = kv_scales | dict(start_lens=meta.decode_start_lens, sink_lens=meta.decode_sink_lens)
        if meta.group_starts is not None:
            return self.cascade_decode(qd, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens,
                                       meta.group_starts, meta.group_prefix_lens, scale,
                                       max_group_size=meta.max_group_size, work_plans=meta.work_plans, **kv_scales)
        return self.paged_decode(qd, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale,
                                 **kv_scales)


def get_backend(name: str) -> Backend:
    """'torch' (references, the CPU path) or 'triton' (GPU kernels; CPU under TRITON_INTERPRET=1)."""
    if name not in ("torch", "triton"):
        raise ValueError(f"attention_backend must be 'torch' or 'triton', got {name!r}")
    suffix = "_ref" if name == "torch" else "_triton"
    fns = {}
    for op in _OPS:
        try:
            module = importlib.import_module(f"pacore_kernels.{_MODULES[op]}")
        except ImportError as e:
            raise RuntimeError(f"attention_backend={name!r} needs kernels.{_MODULES[op]} ({e}); "
                               "install triton or use attention_backend='torch'") from e
        fn = getattr(module, op + suffix, None)
        if fn is None:
            raise RuntimeError(f"pacore_kernels.{_MODULES[op]} has no {op + suffix}; "
                               f"use attention_backend='torch'")
        fns[op] = fn
    return Backend(name=name, **fns)


def with_ranges(ops: Backend) -> Backend:
    """The same ops, each inside a torch.profiler range (attention.* / op.*), for profiling."""
    from torch.profiler import record_function

    def ranged(name: str, fn: Callable) -> Callable:
        def wrapped(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)
        return wrapped
    return dataclasses.replace(ops, **{op: ranged(f"attention.{op}" if "attention" in op or "decode" in op
                                                  else f"op.{op}", getattr(ops, op)) for op in _OPS})


@dataclass(slots=True, frozen=True)
class BatchInvariantBackend(Backend):
    """Every query token through one attention whose result for a query does not depend on the
    others (pacore_kernels/batch_invariant.py): the model runner hands decodes over as one-token chunks."""

    def attention(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scale: float = 1.0,
                  v_scale: float = 1.0, bounds: torch.Tensor | None = None,
                  importance: torch.Tensor | None = None) -> torch.Tensor:
        # importance: never written here (verify rows run as prefill chunks): rows draft over their window
        from pacore_kernels.batch_invariant import max_pairs, plan_attention
        if meta.num_prefill_tokens != q.shape[0]:
            raise RuntimeError("batch-invariant attention takes decodes as one-token prefill chunks (engine bug)")
        self.store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping, k_scale=k_scale, v_scale=v_scale)
        if meta.plan is None:  # the same for every layer of the step
            meta.plan = plan_attention(meta.prefill_cu_seqlens_q, meta.prefill_seq_lens,
                                       meta.prefill_block_tables, k_cache.shape[1],
                                       max_pairs(q.shape[1], k_cache.shape[2], q.shape[2]))
        return self.prefill_attention(q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                                      meta.prefill_seq_lens, scale, plan=meta.plan, k_scale=k_scale, v_scale=v_scale)


def batch_invariant_backend() -> Backend:
    """The torch ops whose per-row results do not depend on the batch (pacore_kernels/batch_invariant.py)."""
    from pacore_kernels import batch_invariant as bi
    fns = {f: getattr(get_backend("torch"), f) for f in _OPS}
    return BatchInvariantBackend(name="batch_invariant", **fns | dict(
        prefill_attention=bi.attention_invariant, rmsnorm=bi.rmsnorm_invariant,
        silu_and_mul=bi.silu_and_mul_invariant))


def default_backend(device: torch.device) -> str:
    return "triton" if device.type == "cuda" else "torch"
