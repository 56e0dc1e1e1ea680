"""The embedded SmolLM2-135M-Instruct: greedy chat outputs equal transformers' token for token."""
import pytest
import torch

from engine import LLM, SamplingParams

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "What is 12 + 30? Answer with a number."]


@pytest.mark.slow
def test_smollm2_greedy_matches_transformers():
    from transformers import AutoModelForCausalLM
    from engine.default_model import resolve_model
    llm = LLM("smollm2-135m", dtype="float32", num_kv_blocks=256)
    chats = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in PROMPTS]
    ids = [llm.tokenizer.encode(c, add_special_tokens=False) for c in chats]
    ours = llm.generate(ids, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(None), dtype=torch.float32).eval()
    for prompt_ids, out in zip(ids, ours):
        x = torch.tensor([prompt_ids])
        with torch.no_grad():
            ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=48, do_sample=False)
        assert out.outputs[0].token_ids == ref[0, len(prompt_ids):].tolist()
    assert "Paris" in ours[0].outputs[0].text
