"""Host-side costs: block manager fork / append / free at 10^4-10^5 blocks, and an engine step at
PaCoRe-8B's shape (batch 32-256 with the cache full, 4 x 128k). These are the per-step Python costs that sit between model forwards.

    python -m pytest bench/bench_host.py --benchmark-only --benchmark-group-by=group
"""
from __future__ import annotations

import itertools

import pytest

from engine.core.block_manager import BlockManager, block_hash
from engine.sample.sampling_params import SamplingParams
from engine.core.sequence import Request, Sequence

BS = 16
_ids = itertools.count()


def _seq(tokens: int, n: int = 1) -> Sequence:
    req = Request(str(next(_ids)), None, [], SamplingParams(n=n, max_tokens=1 << 20))
    toks = [next(_ids) % 50000 for _ in range(tokens)]  # distinct tokens: no accidental prefix hits
    seq = Sequence(req, 0, toks, tokens)
    req.seqs.append(seq)
    return seq


def _prefilled(bm: BlockManager, tokens: int) -> Sequence:
    seq = _seq(tokens)
    bm.allocate(seq, tokens)
    seq.num_computed = tokens
    return seq


@pytest.mark.parametrize("prompt_blocks,k", [(1000, 64), (4000, 32)])
def test_fork(benchmark, prompt_blocks, k):
    """One prompt of 16k / 64k tokens forked into K children (K-1 block-table copies + ref counts)."""
    benchmark.group = "block manager fork"

    def setup():
        bm = BlockManager(prompt_blocks + k + 8, BS)
        parent = _prefilled(bm, prompt_blocks * BS + 3)  # a partial last block: one copy per child
        children = [Sequence(parent.request, i, list(parent.token_ids), parent.num_prompt_tokens) for i in range(1, k)]
        return (bm, parent, children), {}

    def fork(bm, parent, children):
        for c in children:
            bm.fork(parent, c)
    benchmark.pedantic(fork, setup=setup, rounds=20)


@pytest.mark.parametrize("num_seqs", [1000, 4000])
def test_append_block(benchmark, num_seqs):
    """Every sequence crosses a block boundary in the same step: num_seqs new blocks (decode growth)."""
    benchmark.group = "block manager append"

    def setup():
        bm = BlockManager(num_seqs * 4, BS)
        seqs = [_prefilled(bm, 2 * BS) for _ in range(num_seqs)]
        return (bm, seqs), {}

    def append(bm, seqs):
        for s in seqs:
            bm.allocate(s, s.num_computed + 1)
    benchmark.pedantic(append, setup=setup, rounds=20)


@pytest.mark.parametrize("total_blocks", [10_000, 100_000])
def test_free(benchmark, total_blocks):
    """Free 1k sequences that hold total_blocks blocks between them (blocks keep their prefix hashes)."""
    benchmark.group = "block manager free"
    per = total_blocks // 1000

    def setup():
        bm = BlockManager(total_blocks, BS)
        return (bm, [_prefilled(bm, per * BS) for _ in range(1000)]), {}

    def free(bm, seqs):
        for s in seqs:
            bm.free_seq(s)
    benchmark.pedantic(free, setup=setup, rounds=5)


@pytest.mark.parametrize("batch,context", [(32, 24_000), (128, 6_000), (256, 3_000), (4, 128_000)])
def test_engine_decode_step(benchmark, batch, context, tmp_path):
    """One engine step at PaCoRe-8B's shape with a full H200-sized cache (a rehearsal: the real
    scheduler, block manager, ModelRunner.prepare and postprocess; the forward modelled). Reports
    the host phases and the modelled device step (bench/rehearsal/host.py)."""
    from bench.rehearsal.host import filled_engine, measure
    benchmark.group = "engine step host time"
    llm = filled_engine(batch, context, tmp_path)
    benchmark.pedantic(llm.step, rounds=32, warmup_rounds=2)
    benchmark.extra_info.update(measure(llm, 16))


@pytest.mark.parametrize("hasher", ["sha256", "builtin"])
def test_prefix_hash(benchmark, hasher):
    """Hash chain of a 64k-token prompt (4096 blocks), as admission and match_prefix compute it:
    the engine's SHA-256 against Python's tuple hash (what it used before; collisions possible)."""
    benchmark.group = "prefix hash 64k tokens"
    tokens = [next(_ids) % 50000 for _ in range(4096 * BS)]
    fn = block_hash if hasher == "sha256" else (lambda parent, toks: hash((parent, tuple(toks))))

    def chain():
        parent = None
        for i in range(0, len(tokens), BS):
            parent = fn(parent, tokens[i:i + BS])
        return parent
    benchmark.pedantic(chain, rounds=20, warmup_rounds=2)
