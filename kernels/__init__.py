"""PaCoRe kernels: torch references (always available) and Triton kernels (when triton imports).

Layout and batch metadata: engine/kv_cache.py.
"""
from .activation import silu_and_mul_ref
from .cascade_decode import cascade_decode_ref
from .paged_decode import paged_decode_ref
from .prefill_attention import prefill_attention_ref
from .rmsnorm import rmsnorm_ref
from .rope import rope_ref
from .store_kvcache import store_kvcache_ref

__all__ = [
    "store_kvcache_ref", "paged_decode_ref", "cascade_decode_ref", "prefill_attention_ref",
    "rmsnorm_ref", "rope_ref", "silu_and_mul_ref",
]

from ._utils import HAS_TRITON

if HAS_TRITON:
    from .activation import silu_and_mul_triton
    from .cascade_decode import cascade_decode_triton
    from .paged_decode import paged_decode_triton
    from .prefill_attention import prefill_attention_triton
    from .rmsnorm import rmsnorm_triton
    from .rope import rope_triton
    from .store_kvcache import store_kvcache_triton

    __all__ += ["store_kvcache_triton", "paged_decode_triton", "cascade_decode_triton", "prefill_attention_triton",
                "rmsnorm_triton", "rope_triton", "silu_and_mul_triton"]

    try:
        from .prefill_attention import prefill_attention_flash  # only when flash_attn imports

        __all__ += ["prefill_attention_flash"]
    except ImportError:
        pass
