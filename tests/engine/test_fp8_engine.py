"""The engine with an FP8 KV cache: logits close to the model dtype's cache, the Triton path equal to the
torch path, the checkpoint's scales, and every engine feature (prefix cache, fork, copies, preemption,
CUDA graphs, tensor parallel, resume, batch invariance) working on FP8 blocks."""
import _triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from engine import LLM, SamplingParams
from tiny_models import recording_llm, runner_spy

PROMPTS = [list(range(3, 60)), list(range(100, 130))]
# Bound on the engine's logits, FP8 cache vs the model dtype's, as a share of the largest |logit|, on the
# tiny random checkpoints (2 layers, head_dim 16/32): measured worst 0.09 (e4m3) and 0.13 (e5m2) over
# llama/qwen2/qwen3 in fp32 and bf16. A missing scale or a wrong dequantization is off by ~100%.
LOGIT_BOUND = {"fp8_e4m3": 0.1, "fp8_e5m2": 0.15}


def step_logits(llm, prompts=PROMPTS, params=None):
    """Greedy tokens per prompt and the logits [rows, vocab] of every step."""
    logs = []
    params = params or SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with runner_spy(llm, lambda plan, lg: logs.append(lg.clone())):
        out = llm.generate(prompts, params, use_tqdm=False)
    return [[o.token_ids for o in r.outputs] for r in out], logs


def worst_relative_logit_error(base, other):
    """Largest |logit difference| / max |logit| over the steps whose context is the same in both runs
    (every row's tokens so far agree)."""
    (bt, bl), (t, ol) = base, other
    worst = 0.0
    for i, (a, b) in enumerate(zip(bl, ol)):
        if all(x[0][:i] == y[0][:i] for x, y in zip(bt, t)):
            worst = max(worst, ((a - b).abs().max() / a.abs().max()).item())
    return worst


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_logits_are_close_to_the_bf16_caches(kind, fmt, tiny_model_dir):
    path = str(tiny_model_dir(kind))
    base = step_logits(LLM(path, dtype="bfloat16", num_kv_blocks=64, max_model_len=512))
    fp8 = step_logits(LLM(path, dtype="bfloat16", num_kv_blocks=64, max_model_len=512, kv_cache_dtype=fmt))
    assert worst_relative_logit_error(base, fp8) < LOGIT_BOUND[fmt]
    assert len(fp8[1]) == len(base[1])


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_triton_backend_with_fp8_same_tokens_as_torch(kind, tiny_model_dir):
    """Chunked prefill, paged and cascade decode through the Triton kernels (interpreter) on an FP8 cache
    give the torch path's tokens, with logits within float rounding of it. On CPU the store is the
    reference's: the interpreter's float -> FP8 conversion rounds wrongly (tests/pacore_kernels/test_kernels_store.py),
    which a GPU's does not (tests/pacore_kernels/test_kernels_store.py checks the Triton store itself)."""
    pytest.importorskip("triton")
    import dataclasses

    from pacore_kernels.store_kvcache import store_kvcache_ref
    prompts = [torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (21, 40)]
    params = SamplingParams(n=3, temperature=0, max_tokens=6, ignore_eos=True)
    runs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tiny_model_dir(kind)), num_kv_blocks=64, max_num_batched_tokens=32, attention_backend=backend,
                  cascade_attention=True, device="cpu", kv_cache_dtype="fp8_e4m3")
        if backend == "triton":
            llm.runner.ops = llm.runner._plain_ops = dataclasses.replace(llm.runner.ops, store_kvcache=store_kvcache_ref)
        runs[backend] = step_logits(llm, prompts, params)
        assert llm.stats()["cascade_decode_steps"] > 0
    assert runs["triton"][0] == runs["torch"][0]
    assert worst_relative_logit_error(runs["torch"], runs["triton"]) < 1e-3


# --- the checkpoint's scales ------------------------------------------------------------------------
def with_tensors(src, dst, tensors: dict):
    """A copy of checkpoint folder src in dst with extra tensors in its safetensors file."""
    import shutil

    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    (file,) = dst.glob("*.safetensors")
    save_file({**load_file(file), **tensors}, file, metadata={"format": "pt"})
    return dst


def scales_of(llm):
    return [(a.self_attn.k_scale, a.self_attn.v_scale) for a in llm.runner.model.layers]


@pytest.mark.parametrize("names", [("self_attn.k_scale", "self_attn.v_scale"),
                                   ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale")])
def test_kv_scales_are_read_from_the_checkpoint(names, tiny_model_dir, tmp_path):
    kn, vn = names
    extra = {f"model.layers.{i}.{kn}": torch.tensor(0.5 + i) for i in range(2)}
    extra |= {f"model.layers.{i}.{vn}": torch.tensor([2.0 + i]) for i in range(2)}
    extra["model.layers.0.self_attn.q_scale"] = torch.tensor(3.0)  # q stays in the model dtype: ignored
    path = str(with_tensors(tiny_model_dir("llama"), tmp_path / "scaled", extra))
    fp8 = LLM(path, num_kv_blocks=64, max_model_len=512, kv_cache_dtype="fp8_e4m3")
    assert scales_of(fp8) == [(0.5, 2.0), (1.5, 3.0)]
    assert scales_of(LLM(path, num_kv_blocks=64, max_model_len=512)) == [(1.0, 1.0)] * 2  # auto: unscaled
    # The store divides by the scale, attention multiplies by it: logits stay as close as unscaled.
    base = step_logits(LLM(path, num_kv_blocks=64, max_model_len=512))
    assert worst_relative_logit_error(base, step_logits(fp8)) < LOGIT_BOUND["fp8_e4m3"]
    # Layer 0's K and V do not depend on any scale: stored / 0.5 and / 2.0, they dequantize to what an
    # unscaled FP8 cache holds, within two roundings (2 x 2^-4 relative, plus the subnormal step).
    plain = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=512, kv_cache_dtype="fp8_e4m3")
    step_logits(plain)
    for kv, scale in ((0, 0.5), (1, 2.0)):
        a, b = fp8.runner.kv_cache[0, kv].float() * scale, plain.runner.kv_cache[0, kv].float()
        assert b.abs().max() > 0 and ((a - b).abs() <= b.abs() * 2 ** -3 + 2 ** -9 * scale).all()


def test_the_old_single_kv_scale_sets_both(tiny_model_dir, tmp_path):
    extra = {f"model.layers.{i}.self_attn.kv_scale": torch.tensor(0.25) for i in range(2)}
    path = str(with_tensors(tiny_model_dir("llama"), tmp_path / "kv", extra))
    assert scales_of(LLM(path, num_kv_blocks=8, max_model_len=128, kv_cache_dtype="fp8_e5m2")) == [(0.25, 0.25)] * 2


@pytest.mark.parametrize("value, match", [(torch.ones(2), "only per-tensor"), (torch.tensor(0.0), "must be in"),
                                          (torch.tensor(float("inf")), "must be in"), (torch.tensor(1e30), "must be in"),
                                          (torch.tensor(1e-30), "must be in")])
def test_bad_kv_scales_are_refused_naming_the_tensor_and_the_way_out(value, match, tiny_model_dir, tmp_path):
    path = str(with_tensors(tiny_model_dir("llama"), tmp_path / "bad", {"model.layers.1.self_attn.k_scale": value}))
    with pytest.raises(ValueError, match=match) as e:
        LLM(path, num_kv_blocks=8, max_model_len=128, kv_cache_dtype="fp8_e4m3")
    assert "'model.layers.1.self_attn.k_scale'" in str(e.value) and "--kv-cache-dtype auto" in str(e.value)
    # An FP8 cache alone uses the scales: in the model's dtype they are neither read nor checked.
    assert scales_of(LLM(path, num_kv_blocks=8, max_model_len=128)) == [(1.0, 1.0)] * 2


def test_the_per_k_and_v_names_win_over_the_old_kv_scale_and_it_is_said_once(tiny_model_dir, tmp_path, caplog):
    extra = {f"model.layers.{i}.self_attn.kv_scale": torch.tensor(0.25) for i in range(2)}
    extra |= {f"model.layers.{i}.self_attn.k_scale": torch.tensor(0.5) for i in range(2)}
    path = str(with_tensors(tiny_model_dir("llama"), tmp_path / "both", extra))
    with caplog.at_level("WARNING", logger="engine"):
        llm = LLM(path, num_kv_blocks=8, max_model_len=128, kv_cache_dtype="fp8_e4m3")
    assert scales_of(llm) == [(0.5, 0.25)] * 2  # K from k_scale, V from kv_scale (no v_scale given)
    said = [r.getMessage() for r in caplog.records if "twice" in r.getMessage()]
    assert len(said) == 1 and "using self_attn.k_scale" in said[0] and "over self_attn.kv_scale" in said[0]


# --- every engine feature on FP8 blocks ----------------------------------------------------------------
FP8 = dict(kv_cache_dtype="fp8_e4m3")
MAIN = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=20, ignore_eos=True)
PROMPT = torch.randint(3, 256, (150,), generator=torch.Generator().manual_seed(1)).tolist()  # a partial last block


def _seeded(model, setup: str, **kw):
    """The seeded request MAIN on an FP8 batch-invariant engine under one setup: (tokens, logits by
    (child, tokens before), stats)."""
    opts = {"num_kv_blocks": 256, "batch_invariant": True, **FP8, **kw}
    if setup == "preempted":
        opts["num_kv_blocks"] = 16
    elif setup == "no fork":
        opts["enable_fork"] = False
    elif setup == "chunked":
        opts["max_num_batched_tokens"] = 8
    logits = {}
    llm = recording_llm(model, logits, **opts)
    if setup == "prefix cached":  # an earlier request left the prompt's FP8 blocks in the cache
        llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    llm.add_request(PROMPT, MAIN, request_id="main")
    if setup == "resumed":
        for _ in range(8):
            llm.step()
        partial = llm.partial_outputs("main")
        llm = recording_llm(model, logits, **opts)
        llm.add_request(PROMPT, MAIN, request_id="main", resume=partial)
    done = {}
    while llm.has_unfinished():
        done |= {o.request_id: o for o in llm.step()}
    return [o.token_ids for o in done["main"].outputs], logits, llm.stats()


@pytest.fixture(scope="module")
def seeded_reference(tiny_model_dir):
    return _seeded(str(tiny_model_dir("qwen3")), "reference")


@pytest.mark.parametrize("setup", ["preempted", "resumed", "no fork", "chunked", "prefix cached"])
def test_batch_invariant_fp8_logits_are_identical_under_every_setup(setup, seeded_reference, tiny_model_dir):
    """FP8 blocks are forked (a partial block copied), shared by the prefix cache, dropped and recomputed
    on preemption, rebuilt on resume: with batch_invariant=True the logits stay the same bits."""
    ref_tokens, ref_logits, ref_stats = seeded_reference
    tokens, logits, stats = _seeded(str(tiny_model_dir("qwen3")), setup)
    assert tokens == ref_tokens and logits.keys() == ref_logits.keys() and len(logits) == MAIN.n * MAIN.max_tokens
    assert [k for k in ref_logits if not torch.equal(logits[k], ref_logits[k])] == []
    assert stats["kv_cache_dtype"] == "fp8_e4m3"
    if setup == "preempted":
        assert stats["preemptions"] > 0
    if setup == "prefix cached":
        assert stats["prefix_cache_hit_tokens"] >= 144


def test_fp8_greedy_survives_preemption_and_prefix_sharing(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    prompts = [list(range(3, 40)), list(range(3, 40)) + [50, 51], list(range(60, 100))]
    params = SamplingParams(n=2, temperature=0, max_tokens=40, ignore_eos=True)
    big = LLM(model, num_kv_blocks=512, **FP8)
    want = [[o.token_ids for o in r.outputs] for r in big.generate(prompts, params, use_tqdm=False)]
    assert big.stats()["prefix_cache_hit_tokens"] > 0
    small = LLM(model, num_kv_blocks=14, **FP8)
    got = [[o.token_ids for o in r.outputs] for r in small.generate(prompts, params, use_tqdm=False)]
    assert small.stats()["preemptions"] > 0 and got == want


@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_decode_graph_buffers_give_eager_tokens(tiny_model_dir, tp):
    model = str(tiny_model_dir("qwen3"))
    prompts = [torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (35, 50, 7)]
    params = [SamplingParams(n=k, temperature=0.9, seed=k, max_tokens=m, ignore_eos=True)
              for k, m in ((3, 12), (2, 20), (1, 30))]
    kw = dict(num_kv_blocks=128, cascade_attention=True, cascade_min_prefix=16, **FP8)
    eager = LLM(model, **kw).generate(prompts, params, use_tqdm=False)
    with LLM(model, tensor_parallel_size=tp, **kw) as llm:
        llm.runner.capture_decode_graphs(5, emulate=True)
        calls = []
        real_run = llm.runner.graphs.run
        llm.runner.graphs.run = lambda *a: calls.append(a[0].shape[0]) or real_run(*a)
        got = llm.generate(prompts, params, use_tqdm=False)
        assert calls and llm.stats()["cascade_decode_steps"] > 0
    assert [[o.token_ids for o in r.outputs] for r in got] == [[o.token_ids for o in r.outputs] for r in eager]


def test_fp8_tensor_parallel_each_rank_its_own_heads(tiny_model_dir):
    """Two ranks, each storing its own KV heads in FP8 (scales are per layer, the same on every rank):
    the unsplit engine's tokens, and its logits within float rounding."""
    model = str(tiny_model_dir("llama"))  # 2 KV heads: one per rank
    params = SamplingParams(n=3, temperature=0, max_tokens=12, ignore_eos=True)
    one = step_logits(LLM(model, num_kv_blocks=96, **FP8), PROMPTS, params)
    with LLM(model, num_kv_blocks=96, tensor_parallel_size=2, **FP8) as llm:
        assert llm.runner.kv_cache.dtype == torch.float8_e4m3fn and llm.runner.kv_cache.shape[-2] == 1
        two = step_logits(llm, PROMPTS, params)
        assert llm.stats()["kv_bytes_per_token"] == 2 * 2 * 2 * 16  # both ranks' heads, one byte each
    assert two[0] == one[0]
    assert worst_relative_logit_error(one, two) < 1e-3
