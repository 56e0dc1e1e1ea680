"""Speculative decoding on the embedded SmolLM2-135M-Instruct: a fork of 8 gives the tokens decoding
without speculation gives, greedy and seeded (batch_invariant: bit for bit), while drafts are both
accepted and rejected. Short generations: the point is exactness on a real model, not speed."""
import pytest

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def _prompt(llm, text):
    tok = llm.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)


def _both(params, text, **options):
    """(tokens without speculation, tokens with it, the speculative engine's stats)."""
    plain = LLM("smollm2-135m", num_kv_blocks=256, **options)
    prompt = _prompt(plain, text)
    expected = [c.token_ids for c in plain.generate([prompt], params, use_tqdm=False)[0].outputs]
    spec = LLM("smollm2-135m", num_kv_blocks=256, speculative_config=SPEC, **options)
    got = [c.token_ids for c in spec.generate([prompt], params, use_tqdm=False)[0].outputs]
    stats = spec.stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"], stats
    assert stats["kv_blocks_used"] == 0
    return expected, got


def test_greedy_fork_of_8_is_identical():
    params = SamplingParams(n=8, temperature=0, max_tokens=16, ignore_eos=True)
    expected, got = _both(params, "Name the days of the week.")
    assert got == expected


def test_seeded_fork_of_8_at_temperature_1_is_identical_with_batch_invariant():
    params = SamplingParams(n=8, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    expected, got = _both(params, "Repeat exactly, then say why: Monday, Tuesday, Wednesday, Thursday, Friday.",
                          batch_invariant=True)
    assert got == expected
