"""The reference PaCoRe client's pattern against ``pacore serve``: every round sends K concurrent n=1
chat requests with the same messages (stepfun-ai/PaCoRe, base_exp.py ``_run_parallel_calls``), then
the next round's prompt embeds the round's conclusions (the controller template), down to a final
K=1 round. The engine prefills each round's prompt once: the other K-1 requests compute only their
own partial last block (a prompt always keeps one token to compute), the rest comes from the prefix
cache, as for one n=K request."""
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import openai
import pytest
from server_helpers import metrics, serving

from engine import LLM
from pacore.compaction import reference_text
from pacore.prompts import order_responses, round_messages
from engine.serve.app import create_app

MODEL = "tiny"
ROUNDS = [4, 2, 1]  # the reference's [32, 4] then 1, scaled to a tiny model
PROBLEM = "Find the number of ordered pairs (a, b) of positive integers with a + b = 2025 and gcd(a, b) = 1."


def own_tail(prompt_len: int, block: int = 16) -> int:
    """Prompt tokens a request computes itself when the rest of its prompt is cached."""
    return prompt_len - (prompt_len - 1) // block * block


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=256, max_model_len=1024)
    with serving(create_app(llm, MODEL)) as base:
        yield SimpleNamespace(base=base, client=openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0))


def _round(server, messages, k, n=1):
    """k concurrent requests of n choices; returns (texts, prompt tokens, prefill and hit tokens spent)."""
    before = metrics(server.base)
    with ThreadPoolExecutor(k) as pool:
        replies = list(pool.map(lambda _: server.client.chat.completions.create(
            model=MODEL, messages=messages, n=n, max_tokens=8, temperature=1.0, top_p=1.0), range(k)))
    after = metrics(server.base)
    spent = {key: after[key] - before[key] for key in ("pacore_prefill_tokens_total",
                                                       "pacore_prefix_cache_hit_tokens_total")}
    texts = [c.message.content for r in replies for c in r.choices]
    return texts, replies[0].usage.prompt_tokens, spent["pacore_prefill_tokens_total"], \
        spent["pacore_prefix_cache_hit_tokens_total"]


def test_each_round_of_the_reference_pattern_prefills_its_prompt_once(server):
    messages = [{"role": "user", "content": PROBLEM}]
    references: list[str] = []
    for i, k in enumerate(ROUNDS):
        current = messages if i == 0 else round_messages(messages, references, empty_bypasses=False)
        texts, prompt, prefilled, hits = _round(server, current, k)
        assert prefilled + hits == k * prompt  # every prompt token computed or found in the cache
        assert prefilled <= prompt + (k - 1) * own_tail(prompt)  # never the prompt twice
        if i == 0:  # a fresh prompt: exactly once, plus the tails
            assert prefilled == prompt + (k - 1) * own_tail(prompt)
        # As base_exp.py: by length then a fixed shuffle; non-empty responses, text after </think>.
        references = [reference_text(t) for t in order_responses(texts, "official", 0, length=len) if t]


def test_k_concurrent_requests_cost_the_tails_over_one_n_k_request(server):
    k = ROUNDS[0]
    # Two prompts of one length that differ in their first block, so neither finds the other cached.
    _, prompt, n1_prefill, _ = _round(server, [{"role": "user", "content": "A. " + PROBLEM}], k)
    texts, prompt_nk, nk_prefill, _ = _round(server, [{"role": "user", "content": "B. " + PROBLEM}], 1, n=k)
    assert prompt_nk == prompt and len(texts) == k
    assert nk_prefill == prompt  # one fork: the prompt once
    assert n1_prefill == prompt + (k - 1) * own_tail(prompt)  # K requests: the prompt once, plus K-1 tails
