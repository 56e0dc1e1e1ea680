"""When decode rows read a shared prefix once (cascade attention), and which prefix they share.

Two scopes: "request" (this engine's: a request's forked rows share its prompt's blocks, per group)
and "batch" (vLLM V1's: one prefix common to every sequence the step runs, whatever their request;
vllm/v1/core/kv_cache_manager.py ``get_num_common_prefix_blocks``, decided by
vllm/v1/attention/backends/flash_attn.py ``use_cascade_attention``: at least 256 tokens and 8 requests).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class CascadePolicy:
    """When prefix-shared decode attention pays: forced on/off, or by thresholds.

    The plain path reads a group's prefix once per member, cascade once per group, but each layer
    pays a second kernel and a merge of two partial states per row. So in auto mode a group takes
    cascade when it is large enough (min_group, min_prefix, members * prefix >= min_shared_tokens;
    on CPU cascade breaks even near 1024 tokens, bench/bench_decode.py), and a step uses it only
    when the bytes it saves are at least ``min_saved_fraction`` of the KV the plain path would
    read: round 1 of PaCoRe-8B, 32 rows of a 512-token prompt each 16k tokens long, saves ~3% and
    stays on the plain path; round 2, 4 rows of a 64k prompt, saves ~74% and takes cascade.
    """
    enabled: bool | None = None
    min_group: int = 2
    min_prefix: int = 64
    min_shared_tokens: int = 1024  # group size * prefix length
    min_saved_fraction: float = 0.05
    scope: str = "request"  # "batch": vLLM V1's cascade, one prefix common to every sequence of the step

    def prefix_for(self, group_size: int, prefix_len: int) -> int:
        if self.enabled is False or group_size < 2 or prefix_len == 0:
            return 0
        if self.enabled is None and (group_size < self.min_group or prefix_len < self.min_prefix
                                     or group_size * prefix_len < self.min_shared_tokens):
            return 0
        return prefix_len

    def pays(self, saved_tokens: int, read_tokens: int) -> bool:
        """Whether a step whose cascade groups would skip ``saved_tokens`` of the ``read_tokens`` the
        plain path reads should take cascade (always when forced on)."""
        if saved_tokens <= 0:
            return False
        return self.enabled is True or saved_tokens >= self.min_saved_fraction * read_tokens


def common_prefix_blocks(tables: list[list[int]], limit: int) -> int:
    """Leading entries (at most ``limit``) equal in every block table: the blocks they hold in common.
    Runs every step over the whole batch in vLLM's scope, so each table is compared as a slice (C speed)
    and only a table that differs is walked to find where."""
    first = tables[0]
    n = min(limit, len(first))
    for t in tables[1:]:
        if n == 0:
            break
        if t[:n] == first[:n]:
            continue
        k, m = 0, min(n, len(t))
        while k < m and t[k] == first[k]:
            k += 1
        n = k
    return n
