"""The rehearsal's device model: a step's cost for hand-computed plans equals the formula."""
import pytest

from engine.device_model import (DecodeGroup, DeviceParams, ModelShape, PrefillChunk, StepWork,
                                           kv_tokens, step_cost)

# Round numbers so each figure below can be checked by hand.
SHAPE = ModelShape(num_layers=2, hidden_size=8, intermediate_size=16, num_heads=4, num_kv_heads=2, head_dim=2,
                   vocab_size=100, dtype_bytes=2)
W = SHAPE.weight_bytes  # linear layers, norms and the LM head, once per step
DEV = DeviceParams(hbm_bytes_per_s=1e6, peak_flops=1e9, matmul_eff=0.5, linear_bw_eff=0.5, attention_bw_eff=0.5,
                   prefill_attention_eff=0.25, step_overhead_s=1e-3)


def test_shape_sizes():
    # per layer: qkv 8*(4+2*2)*2 = 128, o 4*2*8 = 64, gate|up|down 3*8*16 = 384
    assert SHAPE.linear_params == 2 * (128 + 64 + 384)
    assert SHAPE.lm_head_params == 800
    assert W == (1152 + 800 + 2 * 2 * 8 + 8) * 2  # + two norms per layer and the final one
    assert SHAPE.kv_bytes_per_token == 2 * 2 * 2 * 2 * 2  # K and V, layers, KV heads, head dim, bf16
    assert ModelShape(36, 4096, 12288, 32, 8, 128, 151936, 2).kv_bytes_per_token == 144 * 1024  # PaCoRe-8B


def test_one_decode_batch():
    work = StepWork(decodes=[DecodeGroup("a", [100]), DecodeGroup("b", [300])], sampled=2)
    cost, per = step_cost(work, SHAPE, DEV)
    weights = W / (1e6 * 0.5)
    assert cost.weights == pytest.approx(weights)
    flops = 2 * 1152 * 2 + 2 * 800 * 2
    assert cost.matmul == pytest.approx(max(0.0, flops / (1e9 * 0.5) - weights))
    assert cost.kv_read == pytest.approx((100 + 300 + 2) * 32 / (1e6 * 0.5))  # reads + the two new tokens' stores
    assert cost.sampling == pytest.approx(2 * 100 * 4 * 4 / 1e6)
    assert cost.overhead == pytest.approx(1e-3)
    assert cost.prefill == cost.recompute == cost.attention == 0
    assert cost.limit == pytest.approx(max((W + 402 * 32 + 2 * 100 * 4) / 1e6, (flops) / 1e9))
    # shares: b reads three times a's KV; weights and overhead split by token
    assert per["b"].kv_read == pytest.approx(3 * per["a"].kv_read, rel=0.02)
    assert per["a"].weights == pytest.approx(weights / 2)
    assert sum(p.total for p in per.values()) == pytest.approx(cost.total)


def test_one_cascade_group_reads_its_prefix_once():
    lens = [1000 + 10, 1000 + 20, 1000 + 30, 1000 + 40]
    paged, _ = step_cost(StepWork(decodes=[DecodeGroup("a", lens, shared=1000, cascade=0)], sampled=4), SHAPE, DEV)
    cascade, _ = step_cost(StepWork(decodes=[DecodeGroup("a", lens, shared=1000, cascade=1000)], sampled=4), SHAPE, DEV)
    assert paged.kv_read == pytest.approx((sum(lens) + 4) * 32 / 5e5)
    assert cascade.kv_read == pytest.approx((1000 + 100 + 4) * 32 / 5e5)
    assert paged.limit == cascade.limit  # the floor counts the shared prefix once either way


def test_one_prefill_chunk_and_its_recompute():
    chunk = PrefillChunk("a", start=64, length=32)
    cost, _ = step_cost(StepWork(prefills=[chunk], sampled=1), SHAPE, DEV)
    keys = 32 * 64 + 32 * 33 / 2
    attn_flops = 4 * 2 * 4 * 2 * keys
    assert cost.attention == pytest.approx(max(attn_flops / (1e9 * 0.25), (64 + 64) * 32 / 5e5))
    weights = W / 5e5
    flops = 2 * 1152 * 32 + 2 * 800
    assert cost.prefill == pytest.approx(max(0.0, flops / 5e8 - weights))
    assert cost.recompute == 0
    redo, _ = step_cost(StepWork(prefills=[PrefillChunk("a", 64, 32, recompute=32)], sampled=1), SHAPE, DEV)
    assert redo.prefill == 0 and redo.attention == pytest.approx(0)
    assert redo.recompute == pytest.approx(cost.prefill + cost.attention)
    assert redo.total == pytest.approx(cost.total)


def test_default_h200_holds_about_780k_tokens_of_pacore_8b():
    tokens = kv_tokens(ModelShape(36, 4096, 12288, 32, 8, 128, 151936, 2), DeviceParams())
    assert 740_000 < tokens < 820_000


def test_parameters_from_a_gpu_run(tmp_path):
    f = tmp_path / "h200.json"
    f.write_text('{"hbm_bytes_per_s": 3.9e12, "attention_bw_eff": 0.8, "commit": "abc"}')
    p = DeviceParams.named(str(f))
    assert p.hbm_bytes_per_s == 3.9e12 and p.attention_bw_eff == 0.8 and p.source == str(f)
    f.write_text('{"hbm_bandwidth": 1}')
    with pytest.raises(ValueError, match="unknown device parameter"):
        DeviceParams.from_file(f)
    with pytest.raises(ValueError, match="unknown device 'a100'"):
        DeviceParams.named("a100")


def test_parameters_from_the_json_bench_gpu_kernels_writes(tmp_path):
    f = tmp_path / "device_params.json"
    f.write_text('{"device": "NVIDIA H200", "commit": "abc", "copy_bw_GBps": 3950.0, "matmul_tflops": 640.0, '
                 '"paged_decode_bw_frac": {"B32_L16384": 0.8}, "paged_decode_bw_frac_min_16k": 0.72, '
                 '"prefill_tflops": {"chunked_16384": 300.0, "whole_65536": 350.0, "sdpa_65536": 420.0}}')
    p = DeviceParams.named(str(f))
    assert p.name == "NVIDIA H200" and p.hbm_bytes_per_s == pytest.approx(3.95e12)
    assert p.matmul_eff == pytest.approx(640 / 989) and p.attention_bw_eff == 0.72
    assert p.prefill_attention_eff == pytest.approx(350 / 989)  # the engine's own prefill, not SDPA's


def _decode_rows(prompt: int, suffix: int, n: int, cascade: bool | None = None):
    """A scheduler with one request's n rows sharing a prompt of ``prompt`` tokens, each ``suffix``
    tokens past it; returns its next plan."""
    from engine.core.block_manager import BlockManager
    from engine.sample.sampling_params import SamplingParams
    from engine.core.cascade import CascadePolicy
    from engine.core.scheduler import Scheduler
    from engine.core.sequence import Request, Sequence, Status
    from engine.core.stopping import StopChecker

    bm = BlockManager(n * (prompt + suffix) // 16 + 64, 16)
    sched = Scheduler(bm, StopChecker(None, [], 1 << 20), 256, 4096, CascadePolicy(cascade))
    req = Request("r", None, list(range(prompt)), SamplingParams(n=n, max_tokens=1 << 19))
    parent = Sequence(req, 0, list(range(prompt)), prompt)
    bm.allocate(parent, prompt)
    parent.num_computed = prompt
    req.seqs.append(parent)
    for i in range(n):
        seq = parent if i == 0 else Sequence(req, i, list(range(prompt)), prompt)
        if i:
            bm.fork(parent, seq, prompt)
            req.seqs.append(seq)
        seq.token_ids += [7 + i] * suffix
        bm.allocate(seq, prompt + suffix - 1)
        seq.num_computed = prompt + suffix - 1
        seq.status = Status.RUNNING
        sched.running.append(seq)
    return sched.schedule()


def test_cascade_is_gated_by_the_share_of_bytes_it_saves():
    # round 1 at PaCoRe-8B's lengths: 32 rows of a 512-token prompt, each 16k past it (~3% shared)
    assert not _decode_rows(512, 16384, 32).cascade
    # the same rows early in the round, 256 tokens in: the prompt is most of what they read
    assert _decode_rows(512, 256, 32).cascade
    # round 2: 4 rows of a 64k prompt, 1k past it
    assert _decode_rows(65536, 1024, 4).cascade
    # forced on, it is used whatever it saves; forced off, never
    assert _decode_rows(512, 16384, 32, cascade=True).cascade
    assert not _decode_rows(65536, 1024, 4, cascade=False).cascade


def test_a_verify_step_reads_each_rows_kv_once_for_all_its_queries():
    # two rows of one request: the first verifies 2 drafts (3 queries), the second has none
    work = StepWork(decodes=[DecodeGroup("a", [102, 300], queries=[3, 1])], sampled=4)
    cost, _ = step_cost(work, SHAPE, DEV)
    assert work.num_tokens == 4
    weights = W / 5e5
    flops = 2 * 1152 * 4 + 2 * 800 * 4  # d + 1 tokens through the linear layers and the LM head
    assert cost.weights == pytest.approx(weights)
    assert cost.matmul == pytest.approx(max(0.0, flops / 5e8 - weights))
    assert cost.kv_read == pytest.approx((102 + 300 + 4) * 32 / 5e5)  # each context once, 4 stores
    assert cost.sampling == pytest.approx(4 * 100 * 4 * 4 / 1e6)  # a logits row per query
    attn = 64 * (3 * 99 + 3 * 4 / 2) + 64 * 300  # causal among the 3 new queries
    assert cost.limit == pytest.approx(max((W + 406 * 32 + 4 * 100 * 4) / 1e6, (flops + attn) / 1e9))
    # the same rows decoding one token each read 2 context tokens and store 2 tokens fewer
    plain, _ = step_cost(StepWork(decodes=[DecodeGroup("a", [100, 300])], sampled=2), SHAPE, DEV)
    assert cost.kv_read - plain.kv_read == pytest.approx(4 * 32 / 5e5)


def test_a_verify_rows_attention_flops_bound_it_when_they_outweigh_its_read():
    # 600 queries over a 1,000-token context: at 2.5e8 attention FLOP/s their FLOPs take longer than the read
    work = StepWork(decodes=[DecodeGroup("a", [1000], queries=[600])], sampled=600)
    cost, _ = step_cost(work, SHAPE, DEV)
    flops = 64 * (600 * 400 + 600 * 601 / 2)
    assert flops / 2.5e8 > (1000 + 600) * 32 / 5e5
    assert cost.kv_read == pytest.approx(flops / 2.5e8)
