"""The shapes a roofline needs: the model's (bytes, FLOPs per token) and each step's (tokens, KV read).

Recorded by the profiler (engine/profiler.py) into each step of a timeline, read by bench/roofline.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.step_plan import prefill_completes


@dataclass(slots=True, frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int
    qk_norm: bool = False
    kv_dtype_bytes: int | None = None  # the KV cache's bytes per value (1 for FP8); None: dtype_bytes
    tie_word_embeddings: bool = False
    # FP8 projections (engine/quant/): one byte per parameter plus fp32 scales, per output channel (None)
    # or per (rows, columns) block; fp8_weights False: the projections are in the model's dtype
    fp8_weights: bool = False
    fp8_block: tuple[int, int] | None = None

    @classmethod
    def from_config(cls, cfg, dtype_bytes: int, kv_dtype_bytes: int | None = None) -> "ModelShape":
        quant = getattr(cfg, "quant", None)
        return cls(cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim, cfg.vocab_size, dtype_bytes, cfg.qk_norm, kv_dtype_bytes, cfg.tie_word_embeddings,
                   quant is not None, quant.block if quant is not None else None)

    @property
    def linear_params(self) -> int:
        """q, k, v, o, gate, up and down of every layer."""
        return self.num_layers * self.layer_linear_params

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def layer_linear_params(self) -> int:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size  # q, k, v, o, gate, up, down

    @property
    def layer_projections(self) -> list[tuple[int, int]]:
        """(out, in) of q, k, v, o, gate, up and down."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]

    def projection_bytes(self, n: int, k: int, fp8: bool | None = None) -> int:
        """One [n, k] projection: in the model's dtype, or FP8 (a byte each) and fp32 scales; ``fp8``: whether
        this one is FP8 (a checkpoint may leave some unquantized; default: fp8_weights)."""
        if not (self.fp8_weights if fp8 is None else fp8):
            return self.dtype_bytes * n * k
        scales = n if self.fp8_block is None else -(-n // self.fp8_block[0]) * -(-k // self.fp8_block[1])
        return n * k + 4 * scales

    @property
    def linear_weight_bytes(self) -> int:
        """The projections of every layer: in the model's dtype, or FP8 (a byte each) and fp32 scales."""
        return self.num_layers * sum(self.projection_bytes(n, k) for n, k in self.layer_projections)

    @property
    def weight_bytes(self) -> int:
        """Weights one forward reads: every layer, the final norm and the LM head (the embedding table
        is only gathered row by row, and is the LM head itself when tied: counted once either way). With
        FP8 weights the projections are a byte per parameter; norms and the LM head keep the dtype."""
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        params = self.num_layers * norms + self.hidden_size
        return self.linear_weight_bytes + self.dtype_bytes * (params + self.vocab_size * self.hidden_size)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * (self.kv_dtype_bytes or self.dtype_bytes)

    @property
    def attn_flops_per_pair(self) -> int:
        """QK^T and PV for one (query, key) pair over all layers and query heads."""
        return 4 * self.num_layers * self.num_heads * self.head_dim


@dataclass(slots=True)
class StepShape:
    """What one step computes, captured from its plan (see engine/profiler.py)."""
    new_tokens: int = 0          # query tokens (prefill chunks + one per decode row)
    num_sampled: int = 0         # rows that go through the LM head (sampled, and scored for logprobs)
    decode_rows: int = 0
    kv_tokens_unique: int = 0    # distinct KV tokens the decode rows read (shared blocks once)
    kv_tokens_logical: int = 0   # KV tokens they read when every row reads its whole sequence
    prefill_ctx_read: int = 0    # cached tokens the prefill chunks attend to (before the chunk)
    prefill_attn_pairs: int = 0  # causal (query, key) pairs of the prefill chunks


def distinct_kv_tokens(rows: list[tuple[list[int], int]], block_size: int) -> int:
    """rows = (block table, tokens in cache); each physical block counted once, at its fullest."""
    filled: dict[int, int] = {}
    for table, n in rows:
        for j in range(-(-n // block_size)):
            b = table[j]
            filled[b] = max(filled.get(b, 0), min(block_size, n - j * block_size))
    return sum(filled.values())


def shape_of_plan(plan, block_size: int) -> StepShape:
    """StepShape of a StepPlan, before it runs (num_computed not yet advanced)."""
    s = StepShape()
    for seq, n in plan.prefills:
        start = seq.num_computed
        s.new_tokens += n
        s.num_sampled += prefill_completes(seq, n)
        s.prefill_ctx_read += start
        s.prefill_attn_pairs += n * start + n * (n + 1) // 2
    s.num_sampled += sum(span.count for span in plan.scored)  # prompt logprobs' rows: the LM head too
    rows = [(seq.block_table, seq.num_computed + 1) for seq in plan.decodes]
    s.decode_rows = len(rows)
    s.new_tokens += len(rows)
    s.num_sampled += len(rows)
    s.kv_tokens_logical = sum(n for _, n in rows)
    s.kv_tokens_unique = distinct_kv_tokens(rows, block_size)
    return s
