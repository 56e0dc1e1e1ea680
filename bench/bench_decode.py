"""Decode attention of the torch path: paged (every row reads its whole sequence) vs cascade
(each group's shared prefix once) on synthetic PaCoRe-shaped caches: one prompt forked K ways.

    python -m pytest bench/bench_decode.py --benchmark-only --benchmark-group-by=group

Not collected by the default test run (testpaths = tests/). Heads are SmolLM2-135M's (9 q, 3 kv, 64).
"""
from __future__ import annotations

import pytest
import torch

from pacore_kernels.cascade_decode import cascade_decode_ref
from pacore_kernels.paged_decode import paged_decode_ref

HQ, HKV, D, BS, SUFFIX = 9, 3, 64, 16, 64


def forked_cache(prefix: int, k: int, groups: int = 1, dtype=torch.float32):
    """`groups` prompts of `prefix` tokens, each forked into k rows with SUFFIX own tokens."""
    g = torch.Generator().manual_seed(0)
    pb, sb = prefix // BS, -(-SUFFIX // BS)
    num_blocks = groups * (pb + k * sb)
    k_cache = torch.randn(num_blocks, BS, HKV, D, generator=g, dtype=dtype)
    v_cache = torch.randn(num_blocks, BS, HKV, D, generator=g, dtype=dtype)
    tables, nxt = [], 0
    for _ in range(groups):
        shared = list(range(nxt, nxt + pb))
        nxt += pb
        for _ in range(k):
            tables.append(shared + list(range(nxt, nxt + sb)))
            nxt += sb
    rows = groups * k
    q = torch.randn(rows, HQ, D, generator=g, dtype=dtype)
    meta = dict(block_tables=torch.tensor(tables, dtype=torch.int32),
                seq_lens=torch.full((rows,), prefix + SUFFIX, dtype=torch.int32),
                group_starts=torch.arange(0, rows + 1, k, dtype=torch.int32),
                group_prefix_lens=torch.full((groups,), prefix, dtype=torch.int32))
    return q, k_cache, v_cache, meta


CASES = [(p, k) for p in (256, 1024, 4096) for k in (4, 16, 32)]


@pytest.mark.parametrize("prefix,k", CASES)
def test_paged(benchmark, prefix, k):
    q, kc, vc, m = forked_cache(prefix, k)
    benchmark.group = f"decode prefix={prefix} K={k}"
    benchmark(paged_decode_ref, q, kc, vc, m["block_tables"], m["seq_lens"], D ** -0.5)


@pytest.mark.parametrize("prefix,k", CASES)
def test_cascade(benchmark, prefix, k):
    q, kc, vc, m = forked_cache(prefix, k)
    benchmark.group = f"decode prefix={prefix} K={k}"
    out = benchmark(cascade_decode_ref, q, kc, vc, m["block_tables"], m["seq_lens"], m["group_starts"],
                    m["group_prefix_lens"], D ** -0.5)
    ref = paged_decode_ref(q, kc, vc, m["block_tables"], m["seq_lens"], D ** -0.5)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)  # same attention, less KV read


@pytest.mark.parametrize("impl", ["paged", "cascade"])
def test_many_groups(benchmark, impl):
    """8 problems x K=8 in one batch (a PaCoRe round with several problems in flight)."""
    q, kc, vc, m = forked_cache(1024, 8, groups=8)
    benchmark.group = "decode 8 groups x K=8, prefix=1024"
    if impl == "paged":
        benchmark(paged_decode_ref, q, kc, vc, m["block_tables"], m["seq_lens"], D ** -0.5)
    else:
        benchmark(cascade_decode_ref, q, kc, vc, m["block_tables"], m["seq_lens"], m["group_starts"],
                  m["group_prefix_lens"], D ** -0.5)
