"""Compile count: calls that differ only in per-step integers (split counts, table widths, batch and group
counts) reuse one compiled variant of each attention kernel. Triton compiles one variant per distinct
specialisation key (an int == 1, or divisible by 16, is part of the key unless do_not_specialize);
under the interpreter the keys are computed the way the CUDA launcher does, from the same arguments."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(env.DEVICE != "cpu", reason="counts launches through the interpreter")

from pacore_kernels.cascade_decode import cascade_decode_triton  # noqa: E402
from pacore_kernels.paged_decode import paged_decode_triton  # noqa: E402
from pacore_kernels.prefill_attention import prefill_attention_triton  # noqa: E402


@pytest.fixture
def variants(monkeypatch):
    """kernel name -> set of specialisation keys of its launches."""
    seen: dict[str, set] = {}
    env.record_compile_keys(monkeypatch.setattr, seen)
    return seen


def test_per_step_integers_do_not_multiply_variants(variants):
    bs, Hkv, D, qpk = 16, 2, 64, 2
    gen = torch.Generator().manual_seed(0)
    for seqs, splits in [([1], 1), ([5, 17], 2), ([40, 33, 2], 3), ([100] * 5, 16), ([70, 9, 31, 64], 7)]:
        kc, vc, bt = env.make_paged(seqs, bs, Hkv, D, torch.float32, gen=gen)  # widths 2..8 blocks
        q = torch.randn(len(seqs), Hkv * qpk, D, generator=gen)
        sl = torch.tensor(seqs, dtype=torch.int32)
        paged_decode_triton(q, kc, vc, bt, sl, 1 / math.sqrt(D), num_splits=splits)
        if len(seqs) >= 2:  # one group of all rows sharing the first block, as the engine forms them
            kc, vc, bt = env.make_paged([s + bs for s in seqs], bs, Hkv, D, torch.float32, groups=[len(seqs)],
                                        prefix_lens=[bs], gen=gen)
            i32 = dict(dtype=torch.int32)
            cascade_decode_triton(q, kc, vc, bt, sl + bs, torch.tensor([0, len(seqs)], **i32),
                                  torch.tensor([bs], **i32), 0.125, max_group_size=len(seqs), suffix_splits=splits)
        cu = torch.tensor([0] + torch.tensor(seqs).cumsum(0).tolist(), dtype=torch.int32)
        kc, vc, bt = env.make_paged(seqs, bs, Hkv, D, torch.float32, gen=gen)
        prefill_attention_triton(torch.randn(sum(seqs), Hkv * qpk, D, generator=gen), kc, vc, bt, cu, sl, 0.125)
    counts = {name: len(keys) for name, keys in variants.items()}
    # split 1 writes the output directly (no lse: STORE_LSE off); the cascade suffix stage has a start
    assert counts["_decode_split_kernel"] == 3, counts
    assert counts["_cascade_prefix_kernel"] == 1, counts
    assert counts["_prefill_kernel"] == 1, counts
    # merges of <= 16 slots share one BLOCK_S: paged (2..16 splits) is one variant, cascade (its prefix
    # slots skipped) two: up to 16 slots, and 3 prefix + 16 suffix slots
    assert counts["_merge_splits_kernel"] == 3, counts
