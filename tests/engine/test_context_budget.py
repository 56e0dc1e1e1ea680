"""Budgets that fill the context (max_tokens=None) and context/RoPE overrides at load time."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import merged_rope_parameters
from tiny_models import hf_greedy, runner_spy

YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128}


def test_max_tokens_none_fills_the_context_exactly(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), max_model_len=96, num_kv_blocks=64, block_size=8)
    prompts = [[3, 4, 5, 6, 7], list(range(10, 47))]
    outs = llm.generate(prompts, SamplingParams(n=4, max_tokens=None, temperature=1.0, seed=0, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert [len(c.token_ids) for c in out.outputs] == [96 - len(prompt)] * 4
        assert {c.finish_reason for c in out.outputs} == {"length"}


def test_max_tokens_none_under_preemption(tiny_model_dir):
    """Trajectories that may each grow to the whole context, in a cache that cannot hold them all."""
    llm = LLM(str(tiny_model_dir("llama")), max_model_len=64, num_kv_blocks=10, block_size=8)
    out = llm.generate([[3, 4, 5, 6, 7, 8, 9, 10, 11]],
                       SamplingParams(n=4, max_tokens=None, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    assert [len(c.token_ids) for c in out.outputs] == [64 - 9] * 4
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1  # greedy: one trajectory, four times
    assert llm.stats()["preemptions"] > 0


def test_max_tokens_none_needs_a_cache_that_holds_the_context(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), max_model_len=512, num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="whole KV cache.*max_model_len"):
        llm.add_request([1, 2, 3], SamplingParams(max_tokens=None))
    assert not llm.has_unfinished()


def test_max_tokens_none_leaves_the_callers_params_alone(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), max_model_len=40, num_kv_blocks=16, block_size=8)
    params = SamplingParams(max_tokens=None, temperature=0)
    llm.generate([[1, 2, 3]], params, use_tqdm=False)
    assert params.max_tokens is None


def test_rope_override_merges_over_the_checkpoint(tiny_model_dir):
    from transformers import AutoConfig
    hf = AutoConfig.from_pretrained(tiny_model_dir("qwen3_plain"))
    merged = merged_rope_parameters(hf, {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128})
    assert merged == {**YARN, "rope_theta": hf.rope_parameters["rope_theta"]}
    with pytest.raises(ValueError, match="rope_type must be one of"):
        merged_rope_parameters(hf, {"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="non-empty dict"):
        merged_rope_parameters(hf, "yarn")


@pytest.mark.parametrize("attention_factor", [None, 1.0])
def test_yarn_override_matches_transformers_beyond_the_original_context(tiny_model_dir, attention_factor):
    """LLM(rope_scaling=...) == transformers with the same rope_parameters, at positions past the
    original 128-token context (attention_factor 1.0 is the paper's setting, None transformers')."""
    from transformers import AutoConfig
    folder = tiny_model_dir("qwen3_plain")
    scaling = dict(YARN) if attention_factor is None else {**YARN, "attention_factor": attention_factor}
    rope = merged_rope_parameters(AutoConfig.from_pretrained(folder), scaling)
    prompt = [(7 * i + 3) % 250 + 3 for i in range(150)]
    want_tokens, want_logits = hf_greedy(folder, prompt, 40, rope_parameters=rope, max_position_embeddings=512)
    llm = LLM(str(folder), rope_scaling=scaling, max_model_len=512, num_kv_blocks=64, max_num_batched_tokens=64)
    assert llm.config.rope_type == "yarn"
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == want_tokens
    # the engine's last-prompt-position logits, computed through its own forward
    got_logits = _last_logits(llm, prompt)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
    plain = LLM(str(folder), max_model_len=512, num_kv_blocks=64)
    assert not torch.allclose(_last_logits(plain, prompt), want_logits, atol=1e-3)  # the override matters


def _last_logits(llm, prompt):
    """The logits the engine's forward produced for the prompt's last position."""
    captured = []
    with runner_spy(llm, lambda plan, logits: captured.append(logits[-1].detach().float().clone())):
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    return captured[-1]
