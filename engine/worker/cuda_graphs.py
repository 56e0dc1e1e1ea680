"""Decode steps replayed from CUDA graphs, one per (batch-size bucket, kind of step, cascade).

A decode step of a small model is mostly kernel launches; a graph replays them in one go. Every
per-step input lives in a static buffer that the graph reads: token ids, positions, slots, lengths,
block tables, the cascade groups and (verify steps) the queries' row offsets. A batch of B rows runs in
the smallest bucket >= B; padding rows store nothing (slot -1), attend to one token and form groups
of their own, and their outputs are dropped. With speculative decoding a second set of graphs runs
verify steps: Q = num_speculative_tokens + 1 query slots per row, the real queries packed first
(``cu_seqlens_q``, ragged: a row with fewer drafts uses fewer), the rest of the slots and the padding
rows' queries (0 each) never stored and never attended; self-drafting adds a third set, draft steps
whose rows attend to a sink and a recent window. On CPU the same buffers drive an eager call
("emulate"), so tests cover the padding.
"""
from __future__ import annotations

import weakref

import torch

from engine.worker.attention import AttentionMetadata


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
    def __init__(self, runner, max_batch: int, cascade: bool, emulate: bool = False, verify_queries: int = 1,
                 draft_steps: bool = False):
        """verify_queries: query slots per row of the verify-step graphs (num_speculative_tokens + 1;
        1: no verify graphs); draft_steps: capture self-drafting steps' graphs too."""
        # The runner owns its graphs: a strong reference back would make a cycle that only a gc pass
        # breaks, keeping the KV cache and the weights alive after the last LLM reference goes.
        self.runner = weakref.proxy(runner)
        self.sizes = bucket_sizes(max_batch)
        self.emulate = emulate
        self.verify_queries = verify_queries
        dev, i32 = runner.device, torch.int32
        n, t = max_batch, max_batch * verify_queries
        self.ids = torch.zeros(t, dtype=torch.long, device=dev)
        self.pos = torch.zeros(t, dtype=torch.long, device=dev)
        self.slots = torch.full((t,), -1, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(n, dtype=i32, device=dev)
        self.tables = torch.zeros(n, runner.max_blocks, dtype=i32, device=dev)
        self.group_starts = torch.arange(n + 1, dtype=i32, device=dev)
        self.prefix_lens = torch.zeros(n, dtype=i32, device=dev)
        self.cu_q = torch.zeros(n + 1, dtype=i32, device=dev)
        self.start_lens = torch.zeros(n, dtype=i32, device=dev)
        self.sink_lens = torch.zeros(n, dtype=i32, device=dev)
        # selection "verify": the importance a verify graph writes and a draft graph chooses its blocks by
        self.importance = None if runner.importance is None else torch.full(
            (runner.cfg.num_layers, n, runner.max_blocks), -1.0, device=dev)
        # (size, queries per row (0: a draft step), cascade) -> (graph, its output)
        self.graphs: dict[tuple[int, int, bool], tuple[object, torch.Tensor]] = {}
        pool = None if emulate else torch.cuda.graph_pool_handle()
        kinds = sorted({1, verify_queries}, reverse=True) + ([0] if draft_steps else [])
        for q in kinds:  # the largest first: the others reuse its memory pool
            for size in reversed(self.sizes):
                # Cascade needs >= 2 decodes sharing a prefix: a 1-row cascade graph would never be replayed.
                for use_cascade in ((False, True) if cascade and size >= 2 and q else (False,)):
                    self.graphs[size, q, use_cascade] = self._capture(size, q, use_cascade, pool)

    def _meta(self, size: int, q: int, cascade: bool) -> AttentionMetadata:
        meta = AttentionMetadata(slot_mapping=self.slots[:size * max(q, 1)], num_prefill_tokens=0,
                                 decode_seq_lens=self.seq_lens[:size], decode_block_tables=self.tables[:size],
                                 key_bounds=self.runner.key_bounds)
        if q == 0:
            meta.decode_start_lens, meta.decode_sink_lens = self.start_lens[:size], self.sink_lens[:size]
            meta.decode_select = self.runner.draft_select  # sparse: the blocks chosen inside the graph
        if q > 1:
            meta.decode_cu_seqlens_q, meta.decode_max_query_len = self.cu_q[:size + 1], q
        if self.importance is not None and q != 1:
            meta.block_importance = self.importance[:, :size]
        if cascade:
            meta.group_starts = self.group_starts[:size + 1]
            meta.group_prefix_lens = self.prefix_lens[:size]
            meta.max_group_size = size
        return meta

    def _forward(self, size: int, q: int, cascade: bool) -> torch.Tensor:
        r, t = self.runner, size * max(q, 1)
        ops, layers = (r.window_ops, r.draft_layers) if q == 0 else (r.ops, None)  # a draft step's kept layers
        return r.model(self.ids[:t], self.pos[:t], self._meta(size, q, cascade), r.kv_cache, ops, r.cos_sin, layers)

    def _capture(self, size: int, q: int, cascade: bool, pool):
        if self.emulate:
            return None, None
        self._forward(size, q, cascade)  # warm-up: Triton compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = self._forward(size, q, cascade)
        return graph, out

    def can_run(self, batch_size: int, max_query_len: int = 1, draft: bool = False) -> bool:
        if draft:
            return batch_size <= self.sizes[-1] and (self.sizes[-1], 0, False) in self.graphs
        return batch_size <= self.sizes[-1] and (max_query_len == 1 or max_query_len <= self.verify_queries)

    def run(self, ids, pos, meta: AttentionMetadata) -> torch.Tensor:
        """Inputs as the eager path builds them (host tensors); returns hidden states [T, H], one per query."""
        b, t = meta.decode_seq_lens.shape[0], ids.shape[0]
        size = next(s for s in self.sizes if s >= b)
        q = 1 if meta.decode_cu_seqlens_q is None else self.verify_queries
        if meta.decode_start_lens is not None:  # a draft step; padding rows see their one token
            q = 0
            self.start_lens[:b].copy_(meta.decode_start_lens, non_blocking=True)
            self.start_lens[b:size].fill_(0)
            self.sink_lens[:size].fill_(int(meta.decode_sink_lens[0]) if b else 0)
        cascade = meta.group_starts is not None
        self.ids[:t].copy_(ids, non_blocking=True)
        self.pos[:t].copy_(pos, non_blocking=True)
        self.slots[:t].copy_(meta.slot_mapping, non_blocking=True)
        self.slots[t:size * max(q, 1)].fill_(-1)
        self.seq_lens[:b].copy_(meta.decode_seq_lens, non_blocking=True)
        self.seq_lens[b:size].fill_(1)
        width = meta.decode_block_tables.shape[1]
        self.tables[:b, :width].copy_(meta.decode_block_tables, non_blocking=True)
        if q > 1:  # padding rows have no queries
            self.cu_q[:b + 1].copy_(meta.decode_cu_seqlens_q, non_blocking=True)
            self.cu_q[b + 1:size + 1].fill_(t)
        if cascade:
            starts, prefix = pad_groups(meta.group_starts, meta.group_prefix_lens, b, size)
            self.group_starts[:size + 1].copy_(starts, non_blocking=True)
            self.prefix_lens[:size].copy_(prefix, non_blocking=True)
        imp = meta.block_importance if self.importance is not None and q != 1 else None
        if imp is not None and q == 0:
            self.importance[:, :b, :imp.shape[2]].copy_(imp, non_blocking=True)
        graph, out = self.graphs[size, q, cascade]
        if self.emulate:
            out = self._forward(size, q, cascade)
        else:
            graph.replay()
        if imp is not None and q > 1:  # the verify's importance back to the runner
            imp.copy_(self.importance[:, :b, :imp.shape[2]])
        return out[:t]
