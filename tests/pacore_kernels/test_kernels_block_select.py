"""Sparse self-drafting's block selection: the key bounds follow what the cache holds, the score bounds
every head's q.k from above, the Triton scores are the reference's, and the reduced table makes the
paged decode kernel attend to exactly the sink, the chosen blocks and the recent window."""
import _triton_env as env  # noqa: F401  (must come first)

import pytest
import torch

from pacore_kernels.block_select import (allocate_key_bounds, block_scores_ref, select_blocks, select_blocks_ref,
                                         update_key_bounds)
from pacore_kernels.paged_decode import paged_decode_ref

DEV = env.DEVICE
BS, HKV, D = 4, 2, 16


def _write(cache, bounds, slots, g):
    k = torch.randn(len(slots), HKV, D, generator=g).to(DEV)
    s = torch.tensor(slots, dtype=torch.int64, device=DEV)
    ok = s >= 0
    cache.view(-1, HKV, D)[s[ok]] = k[ok]
    update_key_bounds(bounds, k, s, BS)


def test_bounds_are_the_min_and_max_of_what_each_block_holds():
    g = torch.Generator().manual_seed(0)
    nblocks = 6
    cache = torch.zeros(nblocks, BS, HKV, D, device=DEV)
    bounds = allocate_key_bounds(1, nblocks, HKV, D, torch.float32, DEV)[0]
    _write(cache, bounds, [0, 1, 2, 3, 4, 5, -1, 20, 21], g)     # a prefill chunk, a padding slot
    _write(cache, bounds, [6, 22, -1], g)                        # decodes
    _write(cache, bounds, [4, 5, 6, 7, 8], g)                    # block 1 reused from offset 0: starts afresh
    for blk in (0, 1, 5):
        n = {0: 4, 1: 4, 5: 3}[blk]
        keys = cache[blk, :n]
        assert torch.equal(bounds[0, blk], keys.amin(0)) and torch.equal(bounds[1, blk], keys.amax(0)), blk
    assert torch.equal(bounds[0, 2], cache[2, 0]) and torch.equal(bounds[1, 2], cache[2, 0])


@pytest.mark.parametrize("hq", [2, 6])
def test_the_score_bounds_each_heads_q_dot_k_from_above(hq):
    g = torch.Generator().manual_seed(1)
    nblocks = 12
    cache = torch.randn(nblocks, BS, HKV, D, generator=g).to(DEV)
    bounds = allocate_key_bounds(1, nblocks, HKV, D, torch.float32, DEV)[0]
    update_key_bounds(bounds, cache.view(-1, HKV, D), torch.arange(nblocks * BS, device=DEV), BS)
    q = torch.randn(3, hq, D, generator=g).to(DEV)
    tables = torch.randperm(nblocks, generator=g)[:10].to(DEV, torch.int32).expand(3, -1).contiguous()
    lens = torch.tensor([40, 37, 9], dtype=torch.int32, device=DEV)
    scores = block_scores_ref(q, bounds, tables, lens, BS, sink_blocks=1, recent_blocks=2)
    nb = [10, 10, 3]
    for b in range(3):
        for n in range(10):
            if not 1 <= n < nb[b] - 2:
                assert scores[b, n] == float("-inf"), (b, n)
                continue
            keys = cache[tables[b, n].long()]                               # [BS, Hkv, D]
            true = sum((keys[:, h // (hq // HKV)] @ q[b, h]).max() for h in range(hq))
            assert scores[b, n] >= true - 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_scores_are_the_references(dtype):
    pytest.importorskip("triton")
    from pacore_kernels.block_select import block_scores_triton, select_blocks_triton

    g = torch.Generator().manual_seed(2)
    nblocks, hq = 40, 6
    bounds = allocate_key_bounds(1, nblocks, HKV, D, dtype, DEV)[0]
    update_key_bounds(bounds, torch.randn(nblocks * BS, HKV, D, generator=g).to(DEV, dtype),
                      torch.arange(nblocks * BS, device=DEV), BS)
    q = torch.randn(5, hq, D, generator=g).to(DEV, dtype)
    tables = torch.stack([torch.randperm(nblocks, generator=g)[:19] for _ in range(5)]).to(DEV, torch.int32)
    lens = torch.tensor([76, 73, 12, 1, 40], dtype=torch.int32, device=DEV)   # 19 blocks .. one token
    want = block_scores_ref(q, bounds, tables, lens, BS, 2, 3)
    got = block_scores_triton(q, bounds, tables, lens, BS, 2, 3)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
    t1, l1 = select_blocks_triton(q, bounds, tables, lens, BS, 2, 4, 3)
    t2, l2 = select_blocks_ref(q, bounds, tables, lens, BS, 2, 4, 3)
    assert torch.equal(t1, t2) and torch.equal(l1, l2)


def test_the_reduced_table_attends_to_the_sink_the_top_blocks_and_the_window():
    g = torch.Generator().manual_seed(3)
    nblocks, hq, sink_b, top_k, recent_b = 30, 4, 1, 3, 2
    cache_k = torch.randn(nblocks, BS, HKV, D, generator=g).to(DEV)
    cache_v = torch.randn(nblocks, BS, HKV, D, generator=g).to(DEV)
    tables = torch.stack([torch.randperm(nblocks, generator=g)[:20] for _ in range(3)]).to(DEV, torch.int32)
    lens = torch.tensor([78, 23, 20], dtype=torch.int32, device=DEV)  # 20 blocks (the last partial); 6; 5
    q = torch.randn(3, hq, D, generator=g).to(DEV)
    scores = torch.randn(3, 20, generator=g).to(DEV)
    scores[:, :sink_b] = scores[0, 20 - recent_b:] = float("-inf")  # what block_scores gives the non-candidates
    red, red_lens = select_blocks(scores, tables, lens, BS, sink_b, top_k, recent_b)
    assert red.shape == (3, 6) and red_lens.tolist() == [5 * BS + 2, 23, 20]
    assert torch.equal(red[1], tables[1, :6]) and torch.equal(red[2, :5], tables[2, :5])  # short rows: as they are
    cand = scores[0, sink_b:20 - recent_b]
    top = (cand.topk(top_k).indices + sink_b).sort().values
    keep = [0, *top.tolist(), 18, 19]
    assert red[0].tolist() == tables[0, keep].tolist()
    # the kernel over the reduced table = attention over exactly those blocks' tokens (the last one partial)
    out = paged_decode_ref(q, cache_k, cache_v, red, red_lens, 0.25)
    pos = torch.tensor([n * BS + i for n in keep for i in range(BS)])[:-2]
    blk = tables[0].long()[pos // BS]
    k = cache_k[blk, pos % BS]                                      # [L, Hkv, D]
    v = cache_v[blk, pos % BS]
    kv_head = torch.arange(hq) // (hq // HKV)
    p = torch.softmax(torch.einsum("hd,lhd->hl", q[0], k[:, kv_head]) * 0.25, -1)
    torch.testing.assert_close(out[0], torch.einsum("hl,lhd->hd", p, v[:, kv_head]), atol=1e-5, rtol=1e-5)
