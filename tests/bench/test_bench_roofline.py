"""bench.roofline: the byte and FLOP floors, against numbers worked out by hand."""
from types import SimpleNamespace

import pytest

from bench.roofline import Machine, analyze, floor_bytes, floor_flops, floor_seconds
from engine.core.step_shape import ModelShape, StepShape, distinct_kv_tokens, shape_of_plan

# 2 layers, hidden 8, MLP 16, 2 query heads and 1 KV head of dim 4, vocabulary 10, fp32.
M = ModelShape(num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2, num_kv_heads=1, head_dim=4,
               vocab_size=10, dtype_bytes=4)


def test_model_constants():
    # q 8x8 + k, v 2 x 8x4 + o 8x8 + gate, up, down 3 x 8x16 = 64 + 64 + 64 + 384
    assert M.layer_linear_params == 576
    # (2 layers x (576 + 2 norms of 8) + final norm 8 + LM head 10x8) params x 4 bytes
    assert M.weight_bytes == 4 * (2 * (576 + 16) + 8 + 80) == 5088
    assert M.kv_bytes_per_token == 2 * 2 * 1 * 4 * 4 == 64      # K and V, 2 layers, 1 head of 4, fp32
    assert M.attn_flops_per_pair == 4 * 2 * 2 * 4 == 64          # QK and PV, 2 layers, 2 q heads of 4


def test_distinct_kv_counts_shared_blocks_once():
    # Two trajectories forked from a 32-token prompt (blocks 0, 1) with own partial blocks 2 and 3.
    rows = [([0, 1, 2], 40), ([0, 1, 3], 37)]
    assert distinct_kv_tokens(rows, 16) == 16 + 16 + 8 + 5
    assert distinct_kv_tokens([([0, 1], 17), ([0, 5], 20)], 16) == 16 + 1 + 4  # block 1 vs 5 differ
    assert distinct_kv_tokens([([7], 3), ([7], 9)], 16) == 9  # a shared partial block, at its fullest


def test_decode_floor_by_hand():
    s = StepShape(new_tokens=2, num_sampled=2, decode_rows=2, kv_tokens_unique=45, kv_tokens_logical=77)
    # weights + (45 distinct KV tokens read + 2 written) x 64 bytes
    assert floor_bytes(M, s) == 5088 + 47 * 64 == 8096
    # linear 2 x 2 layers x 576 x 2 tokens + LM head 2 x 10 x 8 x 2 rows + attention 64 x 77 pairs
    assert floor_flops(M, s) == 4608 + 320 + 4928 == 9856
    assert floor_seconds(M, s, bandwidth=1000.0, flops_rate=1000.0) == pytest.approx(9.856)  # FLOP-bound
    assert floor_seconds(M, s, bandwidth=100.0, flops_rate=1000.0) == pytest.approx(80.96)   # memory-bound


def test_prefill_floor_by_hand():
    # One chunk of 8 tokens at positions 16..23 that completes its 24-token prompt.
    seq = SimpleNamespace(num_computed=16, num_tokens=24, block_table=[0, 1])
    s = shape_of_plan(SimpleNamespace(prefills=[(seq, 8)], decodes=[], scored=[]), 16)
    assert (s.new_tokens, s.num_sampled, s.prefill_ctx_read) == (8, 1, 16)
    assert s.prefill_attn_pairs == 8 * 16 + (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8) == 164
    assert floor_bytes(M, s) == 5088 + (16 + 8) * 64 == 6624
    assert floor_flops(M, s) == 2 * 2 * 576 * 8 + 2 * 10 * 8 + 64 * 164 == 29088


def test_shape_of_decode_batch():
    a = SimpleNamespace(num_computed=39, num_tokens=40, block_table=[0, 1, 2])
    b = SimpleNamespace(num_computed=36, num_tokens=37, block_table=[0, 1, 3])
    s = shape_of_plan(SimpleNamespace(prefills=[], decodes=[a, b], scored=[]), 16)
    assert s == StepShape(new_tokens=2, num_sampled=2, decode_rows=2, kv_tokens_unique=45, kv_tokens_logical=77)


def test_analyze_fraction():
    s = StepShape(new_tokens=2, num_sampled=2, decode_rows=2, kv_tokens_unique=45, kv_tokens_logical=77)
    rec = dict(kind="decode", num_decode_seqs=2, num_tokens=2, schedule_s=1.0, model_s=19.712, sample_s=0.0,
               **{k: getattr(s, k) for k in StepShape.__slots__})
    traced = dict(rec, model_s=1e9, traced=True)  # timed under the profiler: ignored
    [row] = analyze([rec, traced], M, Machine(1000.0, 1000.0, "cpu", "float32"))
    assert row["steps"] == 1 and row["floor_ms"] == pytest.approx(9856.0)
    assert row["model_fraction"] == pytest.approx(0.5)
    assert row["step_fraction"] == pytest.approx(9.856 / 20.712)
    assert row["kv_read_logical_over_unique"] == pytest.approx(77 / 45)


def test_weight_bytes_match_a_real_checkpoint(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from engine.config import ModelConfig
    path = tiny_model_dir("qwen3")  # untied, q/k norms, no biases
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    total = sum(p.numel() for p in hf.parameters())
    embed = hf.get_input_embeddings().weight.numel()
    assert ModelShape.from_config(ModelConfig.from_pretrained(path), 4).weight_bytes == 4 * (total - embed)
