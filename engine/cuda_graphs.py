"""Decode steps replayed from CUDA graphs, one per batch-size bucket (with and without cascade).

A decode step of a small model is mostly kernel launches; a graph replays them in one go. Every
per-step input lives in a static buffer that the graph reads: token ids, positions, slots, lengths,
block tables and the cascade groups. A batch of B rows runs in the smallest bucket >= B; padding
rows store nothing (slot -1), attend to one token and form groups of their own, and their outputs
are dropped. On CPU the same buffers drive an eager call ("emulate"), so tests cover the padding.
"""
from __future__ import annotations

import weakref

import torch

from engine.attention import AttentionMetadata


def pad_groups(group_starts: torch.Tensor, group_prefix_lens: torch.Tensor, batch: int,
               size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's cascade groups padded to a bucket: rows batch..size-1 become groups of one (no prefix)
    and the groups after them are empty. Returns int32 group_starts [size + 1], group_prefix_lens [size]."""
    starts = torch.cat([group_starts.to(torch.int32), torch.arange(batch + 1, size + 1, dtype=torch.int32)])
    starts = torch.cat([starts, torch.full((size + 1 - starts.shape[0],), size, dtype=torch.int32)])
    prefix = torch.zeros(size, dtype=torch.int32)
    prefix[:group_prefix_lens.shape[0]] = group_prefix_lens
    return starts, prefix


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


class DecodeGraphs:
    def __init__(self, runner, max_batch: int, cascade: bool, emulate: bool = False):
        # The runner owns its graphs: a strong reference back would make a cycle that only a gc pass
        # breaks, keeping the KV cache and the weights alive after the last LLM reference goes.
        self.runner = weakref.proxy(runner)
        self.sizes = bucket_sizes(max_batch)
        self.emulate = emulate
        dev, i32 = runner.device, torch.int32
        n = max_batch
        self.ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.pos = torch.zeros(n, dtype=torch.long, device=dev)
        self.slots = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(n, dtype=i32, device=dev)
        self.tables = torch.zeros(n, runner.max_blocks, dtype=i32, device=dev)
        self.group_starts = torch.arange(n + 1, dtype=i32, device=dev)
        self.prefix_lens = torch.zeros(n, dtype=i32, device=dev)
        self.graphs: dict[tuple[int, bool], tuple[object, torch.Tensor]] = {}
        pool = None if emulate else torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory pool
            # Cascade needs >= 2 decodes sharing a prefix: a 1-row cascade graph would never be replayed.
            for use_cascade in ((False, True) if cascade and size >= 2 else (False,)):
                self.graphs[size, use_cascade] = self._capture(size, use_cascade, pool)

    def _meta(self, size: int, cascade: bool) -> AttentionMetadata:
        meta = AttentionMetadata(slot_mapping=self.slots[:size], num_prefill_tokens=0,
                                 decode_seq_lens=self.seq_lens[:size], decode_block_tables=self.tables[:size])
        if cascade:
            meta.group_starts = self.group_starts[:size + 1]
            meta.group_prefix_lens = self.prefix_lens[:size]
            meta.max_group_size = size
        return meta

    def _forward(self, size: int, cascade: bool) -> torch.Tensor:
        r = self.runner
        return r.model(self.ids[:size], self.pos[:size], self._meta(size, cascade), r.kv_cache, r.ops, r.cos_sin)

    def _capture(self, size: int, cascade: bool, pool):
        if self.emulate:
            return None, None
        self._forward(size, cascade)  # warm-up: Triton compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = self._forward(size, cascade)
        return graph, out

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= self.sizes[-1]

    def run(self, ids, pos, meta: AttentionMetadata) -> torch.Tensor:
        """Inputs as the eager path builds them (host tensors); returns hidden states [B, H]."""
        b = ids.shape[0]
        size = next(s for s in self.sizes if s >= b)
        cascade = meta.group_starts is not None
        self.ids[:b].copy_(ids, non_blocking=True)
        self.pos[:b].copy_(pos, non_blocking=True)
        self.slots[:b].copy_(meta.slot_mapping, non_blocking=True)
        self.slots[b:size].fill_(-1)
        self.seq_lens[:b].copy_(meta.decode_seq_lens, non_blocking=True)
        self.seq_lens[b:size].fill_(1)
        width = meta.decode_block_tables.shape[1]
        self.tables[:b, :width].copy_(meta.decode_block_tables, non_blocking=True)
        if cascade:
            starts, prefix = pad_groups(meta.group_starts, meta.group_prefix_lens, b, size)
            self.group_starts[:size + 1].copy_(starts, non_blocking=True)
            self.prefix_lens[:size].copy_(prefix, non_blocking=True)
        graph, out = self.graphs[size, cascade]
        if self.emulate:
            return self._forward(size, cascade)[:b]
        graph.replay()
        return out[:b]
