"""n=K forks one prefilled prompt; blocks are shared; cascade attention changes nothing."""
import pytest
import torch

from engine import LLM, SamplingParams


def _prompt(n, seed=0):
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return str(tiny_model_dir("qwen3"))


def test_fork_prefills_once_and_shares_blocks(model):
    prompt = _prompt(200)
    greedy = SamplingParams(n=8, temperature=0, max_tokens=20, ignore_eos=True)
    llm = LLM(model, num_kv_blocks=512)
    out = llm.generate([prompt], greedy, use_tqdm=False)[0]
    s = llm.stats()
    assert s["prefill_tokens"] == 200  # the prompt is computed once, not 8 times
    prompt_blocks, per_seq = 200 // 16, -(-220 // 16)
    assert s["kv_blocks_peak"] <= prompt_blocks + 8 * (per_seq - prompt_blocks)
    assert s["kv_blocks_peak"] < 8 * per_seq / 3
    assert s["kv_blocks_peak_saved"] >= 7 * prompt_blocks
    assert out.metrics.kv_blocks_saved_by_sharing == 7 * prompt_blocks
    single = LLM(model, num_kv_blocks=512).generate([prompt], SamplingParams(temperature=0, max_tokens=20,
                                                                          ignore_eos=True), use_tqdm=False)
    expected = single[0].outputs[0].token_ids
    assert [o.token_ids for o in out.outputs] == [expected] * 8
    assert llm.block_manager.num_used == 0  # every block back once all trajectories finished


@pytest.mark.parametrize("prompt_len", [96, 101])  # block-aligned and with a partial last block
def test_cascade_on_off_same_tokens(model, prompt_len):
    prompts = [_prompt(prompt_len, 1), _prompt(40, 2)]
    params = SamplingParams(n=6, temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)
    outs, stats = {}, {}
    for flag in (True, False):
        llm = LLM(model, num_kv_blocks=512, cascade_attention=flag)
        res = llm.generate(prompts, params, use_tqdm=False)
        outs[flag] = [[o.token_ids for o in r.outputs] for r in res]
        stats[flag] = llm.stats()["cascade_decode_steps"]
    assert outs[True] == outs[False]
    assert stats[True] > 0 and stats[False] == 0


def test_cascade_heuristic(model):
    prompt = _prompt(64)
    short = LLM(model, num_kv_blocks=512, cascade_min_prefix=256)
    short.generate([prompt], SamplingParams(n=4, max_tokens=4, seed=0), use_tqdm=False)
    assert short.stats()["cascade_decode_steps"] == 0  # prefix too short to pay
    long = LLM(model, num_kv_blocks=512, cascade_min_prefix=32, cascade_min_shared_tokens=0)
    long.generate([prompt], SamplingParams(n=4, max_tokens=4, seed=0), use_tqdm=False)
    assert long.stats()["cascade_decode_steps"] > 0
    few = LLM(model, num_kv_blocks=512, cascade_min_prefix=32, cascade_min_shared_tokens=4 * 64 + 1)
    few.generate([prompt], SamplingParams(n=4, max_tokens=4, seed=0), use_tqdm=False)
    assert few.stats()["cascade_decode_steps"] == 0  # 4 members x 64 tokens is below the bar


def test_seeded_sampling_is_reproducible_and_children_differ(model):
    prompt = _prompt(30)
    params = SamplingParams(n=4, temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    a = LLM(model, num_kv_blocks=256).generate([prompt], params, use_tqdm=False)[0]
    b = LLM(model, num_kv_blocks=256).generate([prompt], params, use_tqdm=False)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1


def test_prefix_cache_across_requests(model):
    prompt = _prompt(100)
    llm = LLM(model, num_kv_blocks=256)
    p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    first = llm.generate([prompt], p, use_tqdm=False)[0]
    second = llm.generate([prompt + [5, 6, 7]], p, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 96  # six full blocks came from the cache
    assert llm.stats()["prefill_tokens"] == 100 + 7


def test_fork_off_ablation_same_tokens(model):
    prompt = _prompt(50)
    params = SamplingParams(n=3, temperature=0, max_tokens=10, ignore_eos=True)
    on = LLM(model, num_kv_blocks=256).generate([prompt], params, use_tqdm=False)[0]
    off_llm = LLM(model, num_kv_blocks=256, enable_fork=False, enable_prefix_caching=False)
    off = off_llm.generate([prompt], params, use_tqdm=False)[0]
    assert [o.token_ids for o in on.outputs] == [o.token_ids for o in off.outputs]
    assert off_llm.stats()["prefill_tokens"] == 3 * 50
    assert off_llm.stats()["kv_blocks_peak_saved"] == 0
