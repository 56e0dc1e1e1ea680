"""K identical n=1 requests in flight together (the reference PaCoRe client's pattern against a
server) prefill their prompt once: a waiting prompt that goes on, the same, past where a prefill in
progress has got to waits for it (engine/core/scheduler.py, _rides), and the scheduler publishes a prompt's
full blocks when it allocates them, so a later request finds them in the prefix cache (or in the
same step's forward, which writes a block's KV before any attention reads it). Only the partial last
block, or the last full one since a prompt always keeps one token to compute, is prefilled per
request."""
import pytest

from engine import LLM, SamplingParams

K = 4
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _prompt(n):
    return [3 + (7 * i) % 250 for i in range(n)]


def _own_tail(prompt_len, block=16):
    """Tokens a request prefills itself when the rest of its prompt is cached."""
    return prompt_len - (prompt_len - 1) // block * block


def _run(llm):
    outs = {}
    while llm.has_unfinished():
        for out in llm.step():
            outs[out.request_id] = out.outputs[0].token_ids
    return outs


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def _alone(model, prompt):
    return LLM(model, num_kv_blocks=128, max_model_len=512).generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


# 200: one chunk with a partial last block; 192: block-aligned; 300 with a 64-token budget: chunked prefill.
@pytest.mark.parametrize("prompt_len,budget", [(200, 2048), (192, 2048), (300, 64)])
def test_identical_prompts_added_together_prefill_once(model, prompt_len, budget):
    prompt = _prompt(prompt_len)
    llm = LLM(model, num_kv_blocks=128, max_model_len=512, max_num_batched_tokens=budget)
    for _ in range(K):
        llm.add_request(prompt, GREEDY)
    outs = _run(llm)
    stats = llm.stats()
    tail = _own_tail(prompt_len)
    assert stats["prefill_tokens"] == prompt_len + (K - 1) * tail
    assert stats["prefix_cache_hit_tokens"] == (K - 1) * (prompt_len - tail)
    assert list(outs.values()) == [_alone(model, prompt)] * K
    assert llm.block_manager.num_used == 0


def test_a_request_arriving_mid_prefill_shares_the_blocks_being_computed(model):
    prompt = _prompt(300)
    llm = LLM(model, num_kv_blocks=128, max_model_len=512, max_num_batched_tokens=64)
    llm.add_request(prompt, GREEDY)
    llm.step()  # the first 64 prompt tokens
    llm.add_request(prompt, GREEDY)
    _run(llm)
    assert llm.stats()["prefill_tokens"] == 300 + _own_tail(300)


def test_aborting_the_first_mid_prefill_leaves_the_others_to_finish(model):
    prompt = _prompt(300)
    llm = LLM(model, num_kv_blocks=128, max_model_len=512, max_num_batched_tokens=64)
    first = llm.add_request(prompt, GREEDY)
    for _ in range(K - 1):
        llm.add_request(prompt, GREEDY)
    llm.step()
    llm.abort_request(first)
    outs = _run(llm)
    assert sorted(outs) == ["1", "2", "3"] and list(outs.values()) == [_alone(model, prompt)] * (K - 1)
    # The aborted request's computed blocks stay cached: the prompt is still computed once in all.
    assert llm.stats()["prefill_tokens"] == 300 + (K - 2) * _own_tail(300)


def test_identical_prompts_under_preemption_all_finish_with_their_tokens(model):
    prompt = _prompt(40)  # two full blocks and a partial one
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = LLM(model, num_kv_blocks=10, max_model_len=512)  # 4 sequences of 80 tokens need 14 blocks shared
    for _ in range(K):
        llm.add_request(prompt, params)
    outs = _run(llm)
    alone = LLM(model, num_kv_blocks=64, max_model_len=512).generate([prompt], params, use_tqdm=False)[0]
    assert llm.stats()["preemptions"] > 0
    assert list(outs.values()) == [alone.outputs[0].token_ids] * K
    assert llm.block_manager.num_used == 0
