"""Tiny random-initialised checkpoints written by transformers itself, for parity tests."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from engine.testing import write_char_tokenizer

VOCAB = 256


CONFIGS = {
    "llama": dict(arch="LlamaForCausalLM", cls="LlamaConfig", kw=dict(
        num_key_value_heads=2, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64))),
    "qwen2": dict(arch="Qwen2ForCausalLM", cls="Qwen2Config", kw=dict(
        num_key_value_heads=1, tie_word_embeddings=False)),
    # Default RoPE, for overriding it at load time (LLM(rope_scaling=...)).
    "qwen3_plain": dict(arch="Qwen3ForCausalLM", cls="Qwen3Config", kw=dict(
        num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)),
    "qwen3": dict(arch="Qwen3ForCausalLM", cls="Qwen3Config", kw=dict(
        num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=2.0,
                             original_max_position_embeddings=512))),
}
# A Qwen3 whose next-token distributions are peaked (~1 nat, not ~5.3 of the uniform 5.5): sampled at
# temperature 1 it repeats itself as a trained model does, so speculative drafts are often right.
CONFIGS["qwen3_sharp"] = dict(CONFIGS["qwen3"], lm_head_scale=8.0)


def make_tiny_model(folder: Path, kind: str, seed: int = 0, dtype=torch.float32, vocab: int = VOCAB) -> Path:
    """Write a random 2-layer model of `kind` (llama | qwen2 | qwen3) to folder via transformers."""
    import transformers
    spec = CONFIGS[kind]
    cfg = getattr(transformers, spec["cls"])(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=1024, rms_norm_eps=1e-6,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, **spec["kw"])
    cfg.architectures = [spec["arch"]]
    torch.manual_seed(seed)
    model = getattr(transformers, spec["arch"])(cfg).to(dtype)
    with torch.no_grad():  # larger than default init so that greedy choices are not near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
        model.lm_head.weight.mul_(spec.get("lm_head_scale", 1.0))
    model.save_pretrained(folder, safe_serialization=True)
    write_char_tokenizer(folder, vocab)  # one token per character, so text prompts work
    return folder


def hf_greedy(folder: Path, prompt_ids: list[int], max_new_tokens: int, **config_overrides):
    """transformers' own greedy tokens and the logits at the last prompt position."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **config_overrides)
    model.eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             attention_mask=torch.ones_like(ids), pad_token_id=0)
    return out[0, len(prompt_ids):].tolist(), logits


@contextmanager
def runner_spy(llm, on_run):
    """Call on_run(plan, logits) after every forward of llm's model runner, within the block."""
    run = llm.runner.run

    def spy(plan):
        logits, scored = run(plan)
        on_run(plan, logits)
        return logits, scored
    llm.runner.run = spy
    try:
        yield
    finally:
        del llm.runner.run


def recording_llm(model, logits: dict, **options):
    """An LLM whose sampler first records each row of request "main": logits[(child, tokens before)]."""
    from engine import LLM
    llm = LLM(model, **options)
    sample = llm.sampler

    def recording(rows, seqs, offsets=None, keys=None):
        for row, seq, off in zip(rows, seqs, offsets or [0] * len(seqs)):
            if seq.request.request_id == "main":
                logits[seq.index, seq.num_generated + off] = row.clone()
        return sample(rows, seqs, offsets, keys)
    llm.sampler = recording
    return llm
