"""PaCoRe kernels: torch references (always available) and Triton kernels (when triton imports).

Layout and batch metadata: engine/worker/kv_cache.py. Every *_ref has a *_triton twin with the same
signature; the *_triton names exist only where triton imports.

Triton kernel notes:
- Any block_size (K/V are addressed per token through the block table); head_dim <= 256 (padded to a
  power of two >= 16 and masked; 64 and 128 are the tested ones); any Hq/Hkv ratio.
- q/k/v may be row-strided views (e.g. splits of a fused qkv), but each row's [H, D] must be packed;
  caches must be contiguous; block_tables rows contiguous (int32 or int64).
- paged_decode_triton / prefill_attention_triton never sync with the host. cascade_decode_triton reads
  the largest group size from group_starts (a sync, per call) unless given max_group_size=<int>, as
  the engine always does. With several queries per row (cu_seqlens_q), both decode kernels read the
  largest q_len from the device unless given max_query_len=<int> (a bound: a row with more queries is
  still exact, in more passes over its keys).
- Several queries per row (speculative verification): a decode program's M dim packs the row's queries
  x the kv head's q heads, so each K/V tile is read once per (row, kv head, split) for all of them;
  only the tiles on the causal diagonal are masked. Cascade's prefix stage packs the query rows of a
  group. sink_lens (paged decode): the keys [0, sink) ++ [start, seq) are split as one logical range.
  Optional num_splits (paged) / suffix_splits (cascade) override the split-KV heuristics. Cascade's
  prefix splits are planned on the device from the real groups (cascade_prefix_plan), once per step
  when the caller passes a work_plans dict (AttentionMetadata.work_plans), so a CUDA graph captured
  at a padded bucket splits like an eager call.
- rmsnorm_triton returns new tensors (like the ref); rope_* rotate q and k in place.
- FlashAttention reaches the engine through torch SDPA: a prefill chunk of whole prompts (nothing
  cached before them) runs F.scaled_dot_product_attention on its own K/V (the flash kernel on CUDA;
  prefill_attention.SDPA_WHOLE_PROMPTS). Chunks after a cached prefix run prefill_attention_triton
  (flash-attn's paged varlen kernel needs 256-token blocks; the engine uses 16). The prefill kernel
  packs a kv head's q heads into one block and masks only the diagonal key tiles; its tile map and
  cascade's prefix plan are built once per step (the work_plans dict of AttentionMetadata).
- fp32 inputs use exact fp32 dots (input_precision="ieee"), not TF32. Under the interpreter
  (TRITON_INTERPRET=1 when _utils is imported) the attention dots take fp32 operands, since the
  interpreter's bf16 tl.dot multiplies raw bits: bf16 kernels run there with bf16 storage and
  roundings, only the bf16 MMA itself is left to a GPU (_utils.attn_dot).
- FP8 caches (float8_e4m3fn / float8_e5m2, engine/worker/kv_cache.py): store_kvcache takes k_scale / v_scale and
  writes saturate(x / scale); the attention kernels take the same scales and upcast each K/V tile in
  registers (fp32 accumulation). The interpreter reads FP8 exactly but rounds float -> FP8 wrongly, so
  the store's rounding is checked on a GPU only.

gumbel_sample.py draws tokens (the engine's sampler): Gumbel-max over noise made in registers from each
row's 64-bit key (splitmix64 per vocabulary entry), float64 logs; one program per row reads its
scores once.

batch_invariant.py holds the torch ops of LLM(batch_invariant=True) (no Triton twins): linear layers
in fixed row tiles and an attention whose result for a query does not depend on its batch.
"""
from .activation import silu_and_mul_ref
from .cascade_decode import cascade_decode_ref
from .gumbel_sample import gumbel_argmax_ref
from .paged_decode import paged_decode_ref
from .prefill_attention import prefill_attention_ref
from .rmsnorm import rmsnorm_ref
from .rope import rope_ref
from .store_kvcache import store_kvcache_ref

__all__ = [
    "store_kvcache_ref", "paged_decode_ref", "cascade_decode_ref", "prefill_attention_ref",
    "rmsnorm_ref", "rope_ref", "silu_and_mul_ref", "gumbel_argmax_ref",
]

from ._utils import HAS_TRITON

if HAS_TRITON:
    from .activation import silu_and_mul_triton
    from .cascade_decode import cascade_decode_triton
    from .gumbel_sample import gumbel_argmax_triton
    from .paged_decode import paged_decode_triton
    from .prefill_attention import prefill_attention_triton
    from .rmsnorm import rmsnorm_triton
    from .rope import rope_triton
    from .store_kvcache import store_kvcache_triton

    __all__ += ["store_kvcache_triton", "paged_decode_triton", "cascade_decode_triton", "prefill_attention_triton",
                "rmsnorm_triton", "rope_triton", "silu_and_mul_triton", "gumbel_argmax_triton"]
