"""BlockManager invariants under random operation sequences."""
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager, NoFreeBlocks
from engine.sample.sampling_params import SamplingParams
from engine.core.sequence import Request, Sequence


def _check(bm: BlockManager, live: list[Sequence]) -> None:
    refs = [0] * bm.num_blocks
    for s in live:
        for b in s.block_table:
            refs[b] += 1
    assert refs == bm.ref_count
    assert all(r >= 0 for r in bm.ref_count)
    assert all(bm.ref_count[b] == 0 for b in bm.free)          # nothing both free and in use
    assert sum(1 for r in bm.ref_count if r > 0) + bm.num_free == bm.num_blocks
    assert bm.num_logical == sum(len(s.block_table) for s in live)
    assert bm.num_shared == sum(1 for r in bm.ref_count if r > 1)
    for h, b in bm.cached.items():
        assert bm.hash_of[b] == h


ops = st.lists(st.tuples(st.sampled_from(["new", "grow", "fork", "free"]), st.integers(0, 10**6)),
               max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(4, 40))
def test_random_operations_keep_invariants(ops, block_size, num_blocks):
    bm = BlockManager(num_blocks, block_size)
    req = Request("r", None, [1], SamplingParams())
    live: list[Sequence] = []
    for op, x in ops:
        try:
            if op == "new" or not live:
                # Few distinct prompts so that prefix hits happen.
                toks = [(x % 3) + 1] * (1 + x % (3 * block_size + 2))
                s = Sequence(req, 0, toks, len(toks))
                s.num_computed = bm.match_prefix(s)
                try:
                    bm.allocate(s, s.num_tokens)
                except NoFreeBlocks:
                    bm.free_seq(s)
                    raise
                s.num_computed = s.num_tokens
                live.append(s)
            elif op == "grow":
                s = live[x % len(live)]
                bm.allocate(s, s.num_tokens + 1)
                s.token_ids.append(x % 5)
                s.num_computed += 1
                bm.publish(s, s.num_computed)
            elif op == "fork":
                parent = live[x % len(live)]
                child = Sequence(req, 1, list(parent.token_ids), parent.num_prompt_tokens)
                bm.fork(parent, child)
                live.append(child)
            else:
                s = live.pop(x % len(live))
                bm.free_seq(s)
        except NoFreeBlocks:
            pass
        _check(bm, live)
    for s in live:
        bm.free_seq(s)
    _check(bm, [])
    assert bm.num_free == num_blocks


def test_freed_blocks_stay_cached_until_evicted():
    bm = BlockManager(4, 2)
    req = Request("r", None, [1], SamplingParams())
    a = Sequence(req, 0, [1, 2, 3, 4, 5], 5)
    bm.allocate(a, 5)
    blocks = list(a.block_table)
    bm.free_seq(a)
    b = Sequence(req, 0, [1, 2, 3, 4, 9], 5)
    assert bm.match_prefix(b) == 4 and b.block_table == blocks[:2]
    bm.free_seq(b)
    c = Sequence(req, 0, [7] * 8, 8)  # needs every block: evicts the cached ones
    bm.allocate(c, 8)
    assert not bm.cached or all(bm.ref_count[blk] for blk in bm.cached.values())
