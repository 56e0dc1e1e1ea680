"""ModelRunner: turns a StepPlan into tensors, runs the model, returns logits to sample.

Host work per step is O(batch): each sequence owns a row of a persistent block-table buffer that
is extended by the blocks it gained since the last step, never rebuilt from the whole sequence.

batch_invariant=True: a token's logits are the same bits whatever else is in the batch and however
the token is computed (decode, chunked prefill, recompute after preemption or resume). The linear
layers run in fixed-size row tiles, the ops are pacore_kernels/batch_invariant.py's, and decodes are handed
to attention as one-token prefill chunks, so one attention computation serves every query (no
cascade, no CUDA graphs).

Tensor parallelism: rank 0's runner prepares each step's inputs once and sends them to the worker
ranks (engine/worker/tp_workers.py); every rank then runs ``execute`` on its shard of the model in lock
step, and rank 0 alone gets the logits.

Prompt logprobs: the plan's scored positions (``StepPlan.scored``) are hidden rows too; they go
through the LM head a pass of rows at a time and are reduced to LogprobRows at once (engine/sample/logprobs.py).
"""
from __future__ import annotations

import torch

from engine.worker.attention import AttentionMetadata, batch_invariant_backend, get_backend, with_ranges
from engine.worker.checkpoint_checks import check_context_memory
from engine.config import ModelConfig
from engine.worker.cuda_graphs import DecodeGraphs
from engine.parallel.distributed import Shard, TPGroup, check_graph_capture_env
from engine.worker.kv_cache import allocate_kv_cache, bytes_per_block, copy_blocks, resolve_kv_dtype
from engine.worker.loader import load_model
from engine.sample.logprobs import LogprobRows, compute_logprobs
from engine.worker.model import tile_linears
from engine.sample.sampler import distribution
from engine.core.step_plan import StepPlan
from engine.worker.step_inputs import StepInputs
from engine.core.sequence import Sequence
from engine.spec.importance import BlockImportance
from pacore_kernels._utils import is_fp8
from pacore_kernels.block_select import allocate_key_bounds

_CPU_KV_BYTES = 2 << 30  # the cache on CPU unless told: 2 GiB for all ranks, at most 64k blocks
_MAX_CPU_BLOCKS = 1 << 16
# Scored prompt rows per LM-head pass: a 64k-token prompt's logits at once are 39 GB fp32; 256 rows 156 MB.
_SCORED_ROWS_PER_PASS = 256


class ModelRunner:
    """One rank's model, KV cache and block-table buffer. Rank 0's runner also leads the group: it
    holds ``workers`` (ranks 1..N-1) and its public methods cover them too (shutdown, check_alive,
    dead, min_free_kv_bytes), so the LLM never reaches past it."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, block_size: int,
                 max_num_seqs: int, max_model_len: int, backend: str, cascade: bool = True,
                 batch_invariant: bool = False, shard: Shard | None = None, tp: TPGroup | None = None,
                 workers=None, kv_cache_dtype: str = "auto", logprobs_mode: str = "raw_logprobs",
                 verify_queries: int = 1, draft_steps: bool = False, draft_select: tuple[int, int, int] | None = None,
                 draft_layers: tuple[int, ...] | None = None, draft_selection: str = "bounds"):
        self.cfg, self.dtype, self.device, self.block_size = cfg, dtype, device, block_size
        self.kv_dtype = resolve_kv_dtype(kv_cache_dtype, dtype)
        # A checkpoint's KV scales quantize an FP8 cache only (as vLLM): else neither read nor checked.
        self.model = load_model(cfg, dtype, device, shard, tp, kv_scales=is_fp8(self.kv_dtype))
        # Two roles, two names: rank 0 of a group holds its TPWorkers (engine/worker/tp_workers.py, which
        # imports this module; None on one rank and on a worker); a worker (rank >= 1) mirrors the
        # block-table writes rank 0 sends it.
        self.workers = workers
        self.is_worker = tp is not None and tp.rank > 0
        self.kv_cache: torch.Tensor | None = None
        check_context_memory(max_model_len, cfg, max_num_seqs, block_size, device)  # before its tables are built
        self.cos_sin = cfg.rope_cos_sin(max_model_len).to(device)
        self.ops = get_backend(backend)
        self.cascade = cascade  # whether plans may carry cascade groups (never with batch_invariant)
        self.batch_invariant = batch_invariant
        if batch_invariant:
            self.ops = batch_invariant_backend()
            tile_linears(self.model)
        self._plain_ops = self.ops  # what mark_ranges(False) restores
        self.window_ops = get_backend(backend)  # self-drafting steps' (a sink + window, engine/spec/)
        self.max_blocks = -(-max_model_len // block_size)
        self.tables = torch.zeros(max_num_seqs, self.max_blocks, dtype=torch.int32)
        self.synced = [0] * max_num_seqs  # entries of each row already written
        self.writes: list[tuple[int, int, list[int]]] = []  # for the workers' copies of the buffer
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.max_num_seqs = max_num_seqs
        self.tp_size = tp.size if tp is not None else 1
        self.graphs: DecodeGraphs | None = None
        self.verify_queries = verify_queries  # query slots per row of verify-step graphs (speculation)
        self.draft_steps = draft_steps  # self-drafting: capture its draft steps' graphs too
        # sparse self-drafting: (sink, selected, window) in tokens; the cache then keeps every block's key bounds,
        # or with draft_selection "verify" every buffer row's block importance from its last verify pass
        self.draft_select = None if draft_select is None else self.select_spans(*draft_select)
        self.verify_select = draft_select is not None and draft_selection == "verify"
        self.key_bounds: torch.Tensor | None = None
        self.draft_layers = draft_layers  # the layers a draft step runs (None: all; engine/spec/layer_skip.py)
        self.processed_logprobs = logprobs_mode == "processed_logprobs"  # for a resumed trajectory's scored rows

    @property
    def kv_bytes_per_block(self) -> int:
        """This rank's bytes per block (its KV heads only; with sparse self-drafting, its key bounds too)."""
        cfg = self.cfg
        kv = bytes_per_block(cfg.num_layers, self.block_size, self.model.shard.num_kv_heads, cfg.head_dim,
                             self.kv_dtype)
        if self.draft_select is None or self.verify_select:  # importance is per buffer row, not per block
            return kv
        return kv + cfg.num_layers * 2 * self.model.shard.num_kv_heads * cfg.head_dim * self.dtype.itemsize

    def select_spans(self, sink: int, selected: int, window: int) -> tuple[int, int, int]:
        """A sparse draft step's (sink, top-k, recent) in blocks: each span rounded up to whole blocks."""
        bs = self.block_size
        return -(-sink // bs), -(-selected // bs), max(1, -(-window // bs))

    def free_kv_bytes(self, gpu_memory_utilization: float) -> int:
        """Bytes this rank's GPU can give the cache, its weights loaded. Memory torch's allocator keeps
        cached but unused (an earlier engine's, freed) counts as free: the allocator hands it back to
        the driver when an allocation needs it."""
        free, total = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + cached - total * (1 - gpu_memory_utilization))

    def min_free_kv_bytes(self, gpu_memory_utilization: float) -> int:
        """Bytes every rank's GPU can give the cache: the smallest rank's room decides."""
        mine = self.free_kv_bytes(gpu_memory_utilization)
        if self.workers is None:
            return mine
        return min([mine, *self.workers.call("free_kv_bytes", gpu_memory_utilization)])

    def auto_num_blocks(self, kv_cache_memory: int | None, gpu_memory_utilization: float) -> int:
        """Blocks that fit: kv_cache_memory bytes for all ranks together, or on CUDA what the
        smallest rank's GPU has left at gpu_memory_utilization (weights loaded), or 2 GiB on CPU."""
        per_block, kv_bytes = self.kv_bytes_per_block, kv_cache_memory
        if kv_bytes is not None:
            kv_bytes //= self.tp_size
        elif self.device.type == "cuda":
            kv_bytes = self.min_free_kv_bytes(gpu_memory_utilization)
        if kv_bytes is None:
            return min(_MAX_CPU_BLOCKS, _CPU_KV_BYTES // (per_block * self.tp_size))
        blocks = int(kv_bytes // per_block)
        if blocks < 1:
            raise ValueError(f"kv_cache_memory={kv_bytes} bytes holds no {self.block_size}-token block "
                             f"({per_block} bytes each); give more memory or fewer tokens per block")
        return blocks

    # -- the group of ranks ------------------------------------------------------------------
    closed = False  # set by shutdown (a class default: RehearsalRunner skips __init__)
    importance: BlockImportance | None = None  # the same

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker ranks and release this rank's decode graphs, KV cache and
        weights at once (idempotent). On CUDA the freed memory goes back to the device, so a next
        LLM in this process sizes its cache from it."""
        if self.workers is not None:
            self.workers.shutdown()
        self.closed = True
        self.graphs = self.kv_cache = self.key_bounds = self.importance = self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def check_alive(self) -> None:
        """Raise WorkerDied (engine/worker/tp_workers.py) if a worker rank is gone, RuntimeError after shutdown."""
        self._check_open()
        if self.workers is not None:
            self.workers.check()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this LLM was shut down (shutdown() or the end of its `with` block) and holds no "
                               "model or KV cache any more; create a new one")

    @property
    def dead(self) -> bool:
        """Whether the group can run no more steps: a worker rank died, or rank 0 failed mid-step."""
        return self.workers is not None and bool(self.workers.dead)

    def mark_ranges(self, on: bool) -> None:
        """Run each kernel op inside a torch.profiler range (for a profiling observer), or plainly."""
        self.ops = with_ranges(self._plain_ops) if on else self._plain_ops

    def allocate_kv_cache(self, num_blocks: int, cuda_graphs: bool) -> None:
        """Allocate the cache; then capture decode graphs (they bake in the cache's address)."""
        if self.workers is not None:
            self.workers.call("allocate_kv_cache", num_blocks, False, wait=False)
        cfg = self.cfg
        self.kv_cache = allocate_kv_cache(cfg.num_layers, num_blocks, self.block_size,
                                          self.model.shard.num_kv_heads, cfg.head_dim, self.kv_dtype, self.device)
        if self.verify_select:
            self.importance = BlockImportance(cfg.num_layers, self.max_num_seqs, self.max_blocks, self.device)
        elif self.draft_select is not None:
            self.key_bounds = allocate_key_bounds(cfg.num_layers, num_blocks, self.model.shard.num_kv_heads,
                                                  cfg.head_dim, self.dtype, self.device)
        if cuda_graphs and self.device.type == "cuda" and self.ops.name == "triton":  # never batch_invariant
            try:
                self.capture_decode_graphs(self.max_num_seqs)
            except Exception as e:
                raise RuntimeError(f"capturing the decode CUDA graphs failed ({type(e).__name__}: {e}); run without "
                                   "them: LLM(..., enforce_eager=True), pacore run/serve --enforce-eager") from e

    def capture_decode_graphs(self, max_batch: int, emulate: bool = False) -> None:
        """Capture decode graphs on every rank, in the same order: their all-reduces pair up at replay.
        emulate=True drives the graphs' static buffers eagerly (for CPU tests)."""
        if self.tp_size > 1 and not emulate:
            check_graph_capture_env()
        if self.workers is not None:
            self.workers.call("capture_decode_graphs", max_batch, emulate, wait=False)
        self.graphs = DecodeGraphs(self, max_batch, cascade=self.cascade, emulate=emulate,
                                   verify_queries=self.verify_queries, draft_steps=self.draft_steps)

    # -- rows of the persistent block-table buffer -------------------------------------------
    def release(self, seq: Sequence) -> None:
        if seq.row >= 0:
            self.free_rows.append(seq.row)
            seq.row = -1

    def trimmed(self, seq: Sequence) -> None:
        """seq's block table lost its tail (a verify step's rejected drafts): the row's entries past it
        are rewritten when it grows again."""
        if seq.row >= 0:
            self.synced[seq.row] = min(self.synced[seq.row], len(seq.block_table))

    def _sync_rows(self, seqs: list[Sequence]) -> torch.Tensor:
        for seq in seqs:
            if seq.row < 0:
                seq.row = self.free_rows.pop()
                self.synced[seq.row] = 0
                if self.importance is not None:  # a new sequence in the row: no verify yet
                    self.importance.forget(seq.row)
            have, n = self.synced[seq.row], len(seq.block_table)
            if n > have:
                self.tables[seq.row, have:n] = torch.tensor(seq.block_table[have:n], dtype=torch.int32)
                self.synced[seq.row] = n
                if self.workers is not None:  # rank 0 sends its writes to the workers' buffers
                    self.writes.append((seq.row, have, seq.block_table[have:n]))
        return torch.tensor([s.row for s in seqs], dtype=torch.long)

    def _table_rows(self, seqs: list[Sequence], seq_lens: list[int]) -> tuple[torch.Tensor, int]:
        return self._sync_rows(seqs), -(-max(seq_lens) // self.block_size)

    # -- batch preparation -------------------------------------------------------------------
    def prepare(self, plan: StepPlan) -> StepInputs:
        bs = self.block_size
        ids: list[int] = []
        pos: list[torch.Tensor] = []
        slots: list[torch.Tensor] = []
        sample_idx: list[int] = []  # hidden rows that get logits: completed prefills, then decodes
        tables: dict[str, tuple[torch.Tensor, int]] = {}
        meta = AttentionMetadata(slot_mapping=None, num_prefill_tokens=0)
        chunk_at: dict[int, int] = {}  # seq id -> its chunk's first hidden row
        # (sequence, the tokens it runs from num_computed on, whether its last row is sampled)
        chunks = [(seq, seq.token_ids[seq.num_computed:seq.num_computed + n], completes)
                  for (seq, n), completes in zip(plan.prefills, plan.completes)]
        # A decode row's queries: its last token, then its drafts (a verify step).
        decodes = [(s, [s.token_ids[-1], *plan.drafts[s.seq_id]] if s.seq_id in plan.drafts else [s.token_ids[-1]])
                   for s in plan.decodes]
        if self.batch_invariant:  # a decode row is a chunk of its queries, every one sampled
            chunks += [(seq, tokens, None) for seq, tokens in decodes]
            decodes = []
        if chunks:
            cu, lens = [0], []
            for seq, tokens, completes in chunks:
                chunk_at[seq.seq_id] = cu[-1]
                start, end = seq.num_computed, seq.num_computed + len(tokens)
                ids.extend(tokens)
                p = torch.arange(start, end)
                first = start // bs
                table = torch.tensor(seq.block_table[first:(end - 1) // bs + 1], dtype=torch.long)
                slots.append(table[p // bs - first] * bs + p % bs)
                pos.append(p)
                cu.append(cu[-1] + len(tokens))
                lens.append(end)
                if completes is None:
                    sample_idx.extend(range(cu[-2], cu[-1]))
                elif completes:
                    sample_idx.append(cu[-1] - 1)
            meta.num_prefill_tokens = cu[-1]
            meta.prefill_cu_seqlens_q = torch.tensor(cu, dtype=torch.int32)
            meta.prefill_seq_lens = torch.tensor(lens, dtype=torch.int32)
            tables["prefill"] = self._table_rows([s for s, _, _ in chunks], lens)
        if decodes:
            dpos: list[int] = []
            dslots: list[int] = []
            lens = []
            for seq, tokens in decodes:
                ids.extend(tokens)
                table, p0 = seq.block_table, seq.num_computed
                for p in range(p0, p0 + len(tokens)):
                    dpos.append(p)
                    dslots.append(table[p // bs] * bs + p % bs)
                lens.append(p0 + len(tokens))
            pos.append(torch.tensor(dpos))
            slots.append(torch.tensor(dslots))
            meta.decode_seq_lens = torch.tensor(lens, dtype=torch.int32)
            if len(dpos) > len(decodes):  # verify rows: queries packed per row
                cu = [0]
                for _, tokens in decodes:
                    cu.append(cu[-1] + len(tokens))
                meta.decode_cu_seqlens_q = torch.tensor(cu, dtype=torch.int32)
                meta.decode_max_query_len = max(len(t) for _, t in decodes)
            tables["decode"] = self._table_rows(plan.decodes, lens)
            if plan.cascade:
                meta.group_starts = torch.tensor(plan.group_starts, dtype=torch.int32)
                meta.group_prefix_lens = torch.tensor(plan.group_prefix_lens, dtype=torch.int32)
                meta.max_group_size = plan.max_group_size
            first = meta.num_prefill_tokens
            sample_idx.extend(range(first, first + len(dpos)))
        meta.slot_mapping = torch.cat(slots)
        writes, self.writes = self.writes, []
        graph = (self.graphs is not None and not chunks
                 and self.graphs.can_run(len(plan.decodes), meta.decode_max_query_len))
        inputs = StepInputs(torch.tensor(ids), torch.cat(pos), meta, torch.tensor(sample_idx, dtype=torch.long),
                            plan.copies, graph, tables, writes)
        if plan.scored:
            self._prepare_scored(plan, chunk_at, inputs)
        return inputs

    def _prepare_scored(self, plan: StepPlan, chunk_at: dict[int, int], inputs: StepInputs) -> None:
        rows: list[int] = []
        targets: list[int] = []
        params: list = []
        for span in plan.scored:
            seq = span.seq
            first = chunk_at[seq.seq_id] + span.start - seq.num_computed
            rows.extend(range(first, first + span.count))
            targets.extend(seq.token_ids[span.start + 1:span.start + 1 + span.count])
            processed = self.processed_logprobs and not span.prompt  # prompt logprobs are always raw
            params.extend([seq.params if processed else None] * span.count)
        inputs.scored_idx = torch.tensor(rows, dtype=torch.long)
        inputs.scored_targets = torch.tensor(targets, dtype=torch.long)
        inputs.scored_top = max(span.num_top for span in plan.scored)
        inputs.scored_params = params if any(p is not None for p in params) else None

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> tuple[torch.Tensor | None, LogprobRows | None]:
        """Forward one plan, then make its block copies; returns fp32 logits, one row per
        ``plan.sample_seqs`` entry, and the logprobs of ``plan.scored``'s positions (None without)."""
        logits, scored = self._execute_all(self.prepare(plan))
        if logits is not None and len(plan.sample_rows) != logits.shape[0]:  # a forked prompt's row, per trajectory
            logits = logits[torch.tensor(plan.sample_rows, device=logits.device)]
        return logits, scored

    @torch.inference_mode()
    def run_draft(self, seqs: list[Sequence], tokens: list[int], offset: int, window: int, sink: int,
                  window_fraction: float = 0.0, selected: int = 0) -> torch.Tensor:
        """One self-drafting step (engine/spec/self_window.py): row i's query ``tokens[i]`` at position
        ``num_computed + offset`` attends to its first ``sink`` tokens and its last ``window`` (itself
        included; with ``window_fraction``, its last max(window, fraction x its length)), and with
        ``selected`` to that many tokens of the top-scoring blocks between (each span then in whole
        blocks); its K/V go into the row's own slot, which the verify pass overwrites. fp32 logits
        [rows, V]. Batch-invariant engines draft with the plain ops: a draft only decides which
        positions are verified, never which token is emitted."""
        return self._execute_all(self.prepare_draft(seqs, tokens, offset, window, sink, window_fraction, selected))[0]

    def prepare_draft(self, seqs: list[Sequence], tokens: list[int], offset: int, window: int, sink: int,
                      window_fraction: float = 0.0, selected: int = 0) -> StepInputs:
        """run_draft's inputs (the rehearsal's runner prepares them and models the step)."""
        bs = self.block_size
        pos = [s.num_computed + offset for s in seqs]
        lens = [p + 1 for p in pos]
        i32 = torch.int32
        meta = AttentionMetadata(
            slot_mapping=torch.tensor([s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, pos)]),
            num_prefill_tokens=0, decode_seq_lens=torch.tensor(lens, dtype=i32),
            decode_start_lens=torch.tensor([max(0, n - max(window, int(window_fraction * n))) for n in lens], dtype=i32),
            decode_sink_lens=torch.full((len(seqs),), sink, dtype=i32))
        if selected:
            meta.decode_select = self.select_spans(sink, selected, window)
            if meta.decode_select != self.draft_select:
                raise RuntimeError(f"a sparse draft step {meta.decode_select} in an engine made for {self.draft_select} "
                                   "(engine bug: the runner's draft_select comes from the speculative config)")
        tables = {"decode": self._table_rows(seqs, lens)}
        writes, self.writes = self.writes, []
        graph = self.graphs is not None and self.graphs.can_run(len(seqs), draft=True)
        return StepInputs(torch.tensor(tokens), torch.tensor(pos), meta, torch.arange(len(seqs)), [], graph,
                          tables, writes, draft=True)

    def _execute_all(self, inputs: StepInputs) -> tuple[torch.Tensor | None, LogprobRows | None]:
        """execute() on every rank (the workers first, then this one), a worker's death explained."""
        self._check_open()
        if self.workers is None:
            return self.execute(inputs)
        self.workers.call("execute", inputs, wait=False)
        try:
            return self.execute(inputs)
        except Exception as e:
            raise self.workers.explain(e) from e

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> tuple[torch.Tensor | None, LogprobRows | None]:
        """Run this rank's shard on one step's inputs; fp32 logits of the sampled rows (None when
        no row is sampled: a step of prompt chunks only), and the scored rows' logprobs."""
        ids, positions, meta, sample_idx = inputs.ids, inputs.positions, inputs.meta, inputs.sample_idx
        if self.is_worker:  # mirror what rank 0 wrote to its buffer
            for row, start, blocks in inputs.table_writes:
                self.tables[row, start:start + len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
                if start == 0 and self.importance is not None:  # rank 0 gave the row to a new sequence
                    self.importance.forget(row)
        for kind, (rows, width) in inputs.tables.items():
            setattr(meta, f"{kind}_block_tables", self.tables[rows, :width])
        meta.key_bounds = self.key_bounds  # this rank's (None: no sparse self-drafting)
        rows = self._importance_rows(inputs)
        if rows is not None:  # selection "verify": a draft step reads its rows', a verify step writes them
            meta.block_importance = self.importance.for_step(rows, inputs.tables["decode"][1], inputs.draft)
        if inputs.graph:
            hidden = out = self.graphs.run(ids, positions, meta)  # decode rows are the sampled rows (none scored)
        else:
            if self.device.type != "cpu":
                ids, positions, sample_idx = (t.to(self.device, non_blocking=True)
                                              for t in (ids, positions, sample_idx))
                for f in AttentionMetadata.__slots__:
                    v = getattr(meta, f)
                    if isinstance(v, torch.Tensor):
                        setattr(meta, f, v.to(self.device, non_blocking=True))
            ops, layers = (self.window_ops, self.draft_layers) if inputs.draft else (self.ops, None)
            out = self.model(ids, positions, meta, self.kv_cache, ops, self.cos_sin, layers)
            hidden = out[sample_idx]
        if rows is not None and not inputs.draft:
            self.importance.store(rows, meta.block_importance)
        self.copy_blocks(inputs.copies)  # a fork's partial prompt block, now that the forward wrote it
        scored = self._score(out, inputs) if inputs.scored_idx is not None else None
        if len(sample_idx) == 0:
            return None, scored
        return self.model.compute_logits(hidden), scored

    def _importance_rows(self, inputs: StepInputs) -> torch.Tensor | None:
        """The buffer rows whose importance a draft step reads or a verify step (rows with drafts) writes."""
        if self.importance is None or "decode" not in inputs.tables or not (inputs.draft or inputs.meta.decode_cu_seqlens_q is not None):
            return None
        return inputs.tables["decode"][0].to(self.device)

    def _score(self, hidden: torch.Tensor, inputs: StepInputs) -> LogprobRows | None:
        """Logprobs of the scored rows, a pass of rows at a time (every rank joins the LM head's gather;
        rank 0 alone reduces)."""
        idx = inputs.scored_idx.to(hidden.device)
        targets = inputs.scored_targets.to(hidden.device)
        parts = []
        for lo in range(0, len(idx), _SCORED_ROWS_PER_PASS):
            hi = lo + _SCORED_ROWS_PER_PASS
            logits = self.model.compute_logits(hidden[idx[lo:hi]])
            if self.is_worker:
                continue
            params = inputs.scored_params[lo:hi] if inputs.scored_params is not None else None
            parts.append(compute_logprobs(distribution(logits, params), targets[lo:hi], inputs.scored_top))
        return None if self.is_worker else LogprobRows.concat(parts)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            src, dst = zip(*pairs)
            src, dst = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
            copy_blocks(self.kv_cache, src, dst)
            if self.key_bounds is not None:  # the copy's offsets past the fork widen the source's bounds
                self.key_bounds[:, :, dst] = self.key_bounds[:, :, src]
