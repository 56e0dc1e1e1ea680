"""Greedy tokens and logits agree with transformers on tiny Llama / Qwen2 / Qwen3 checkpoints."""
import pytest
import torch

from engine import LLM, SamplingParams
from tiny_models import hf_greedy, runner_spy

KINDS = ["llama", "qwen2", "qwen3"]  # GQA 2:1 / 4:1, tied and untied, llama3 and YaRN RoPE
PROMPT_LENS = [5, 16, 37, 150]       # below, at and off the block size; longer than the chunk budget


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = LLM(str(tiny_model_dir(kind)), num_kv_blocks=256, max_num_batched_tokens=64)
        return cache[kind]
    return get


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (n,), generator=g).tolist()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", PROMPT_LENS)
def test_greedy_matches_transformers(kind, n, engines, tiny_model_dir):
    prompt = _prompt(n, seed=n)
    expected, _ = hf_greedy(tiny_model_dir(kind), prompt, 32)
    out = engines(kind).generate([prompt], SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    assert out[0].outputs[0].token_ids == expected


@pytest.mark.parametrize("kind", KINDS)
def test_last_position_logits_match(kind, engines, tiny_model_dir):
    prompt = _prompt(45, seed=7)
    _, expected = hf_greedy(tiny_model_dir(kind), prompt, 1)
    llm = engines(kind)
    steps = []
    with runner_spy(llm, lambda plan, logits: steps.append(([c for _, c in plan.prefills], logits))):
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    [(chunks, logits)] = steps  # 45 tokens fit the 64-token budget: one prefill step
    assert chunks == [len(prompt)]
    torch.testing.assert_close(logits[0], expected, rtol=1e-4, atol=1e-4)


def test_batched_requests_match_single(engines):
    """Continuous batching of different prompts gives each prompt its own greedy output."""
    llm = engines("qwen3")
    prompts = [_prompt(n, seed=100 + n) for n in (3, 20, 33, 70)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    together = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in together] == alone


def test_text_prompt_and_text_output(engines):
    llm = engines("llama")
    out = llm.generate("hello world", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.prompt == "hello world"
    assert out.prompt_token_ids == llm.tokenizer.encode("hello world")
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)
    assert out.outputs[0].finish_reason == "length"
