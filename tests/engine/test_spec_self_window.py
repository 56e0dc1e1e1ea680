"""Self-drafting over a windowed KV (speculative_config method "self_window") is exact: coupled acceptance
emits the tokens decoding without speculation draws (greedy and seeded: token for token; unseeded: the
same distribution), rejection acceptance the same distribution; with a window covering the whole context
the draft is the model itself."""
import pytest
import torch

from engine import LLM, SamplingParams
from spec_samples import same_distribution, samples
from test_spec_decode import PROMPTS, _exercised, _tokens

SW = {"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 2}


def _both(model, prompts, params, spec=SW, **options):
    plain = LLM(str(model), skip_tokenizer_init=True, **options).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(model), skip_tokenizer_init=True, speculative_config=spec, **options)
    return plain, llm.generate(prompts, params, use_tqdm=False), llm


@pytest.mark.parametrize("kind,options", [
    ("qwen3", dict(cascade_attention=True, kv_cache_dtype="fp8_e4m3")),
    ("llama", dict(num_kv_blocks=14, max_num_seqs=8)),  # preemption
], ids=["qwen3-cascade-fp8", "llama-preempt"])
def test_greedy_is_identical(tiny_model_dir, kind, options):
    params = SamplingParams(n=4, temperature=0, max_tokens=32, ignore_eos=True)
    plain, spec, llm = _both(tiny_model_dir(kind), PROMPTS, params, **options)
    assert _tokens(spec) == _tokens(plain)
    st = _exercised(llm)
    assert st["kv_blocks_used"] == 0
    if "num_kv_blocks" in options:
        assert st["preemptions"] > 0


def test_seeded_sampling_is_identical_bit_for_bit(tiny_model_dir):
    params = [SamplingParams(n=4, temperature=1.0, max_tokens=40, seed=s, logprobs=2, ignore_eos=True) for s in (1, 2)]
    plain, spec, llm = _both(tiny_model_dir("qwen3_sharp"), PROMPTS[:2], params, batch_invariant=True)
    assert _tokens(spec) == _tokens(plain)
    assert [[o.logprobs.logprobs for o in r.outputs] for r in spec] == [[o.logprobs.logprobs for o in r.outputs]
                                                                        for r in plain]
    _exercised(llm)


def test_a_window_over_the_whole_context_drafts_the_model_itself(tiny_model_dir):
    """Draft logits equal the verify pass's at the same positions (float noise only), so every greedy draft
    is accepted."""
    llm = LLM(str(tiny_model_dir("qwen3")), skip_tokenizer_init=True,
              speculative_config=dict(SW, window=4096, sink=0))
    drafts, verified = [], []
    run_draft, run = llm.runner.run_draft, llm.runner.run

    def spy_draft(seqs, tokens, offset, window, sink):
        logits = run_draft(seqs, tokens, offset, window, sink)
        drafts.extend(((s.seq_id, s.num_computed + offset), row) for s, row in zip(seqs, logits))
        return logits

    def spy_run(plan):
        logits, scored = run(plan)
        for seq, off, row in zip(plan.sample_seqs, plan.sample_offsets or [0] * len(plan.sample_seqs), logits):
            verified.append(((seq.seq_id, seq.num_computed + off), row))
        return logits, scored
    llm.runner.run_draft, llm.runner.run = spy_draft, spy_run
    llm.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    target = dict(verified)
    diffs = [(torch.softmax(row, -1) - torch.softmax(target[key], -1)).abs().max().item() for key, row in drafts]
    assert len(diffs) > 50 and max(diffs) < 1e-5
    st = llm.stats()
    assert st["spec_decode_num_accepted_tokens"] == st["spec_decode_num_draft_tokens"] > 0


@pytest.mark.parametrize("acceptance", ["coupled", "rejection"])
def test_unseeded_sampling_keeps_the_distribution(tiny_model_dir, plain_samples, acceptance):
    ours, llm = samples(tiny_model_dir("qwen3_sharp"), dict(SW, window=2, sink=1, acceptance=acceptance),
                        sampler_seed=4)
    assert len(plain_samples) == len(ours) == 20_000
    _exercised(llm)
    assert min(same_distribution(plain_samples, ours)) > 1e-3


def test_rejection_accepts_more_than_coupled_and_changes_the_tokens(tiny_model_dir):
    params = SamplingParams(n=4, temperature=1.0, max_tokens=48, seed=3, ignore_eos=True)
    model = tiny_model_dir("qwen3_sharp")
    _, coupled, c = _both(model, PROMPTS, params)
    _, rejected, r = _both(model, PROMPTS, params, spec=dict(SW, acceptance="rejection"))
    rate = lambda llm: llm.stats()["spec_decode_acceptance_rate"]  # noqa: E731
    assert rate(r) > rate(c) > 0
    assert _tokens(rejected) != _tokens(coupled)


@pytest.mark.parametrize("bad,match", [
    ({"method": "self_window", "prompt_lookup_min": 2}, "apply to method 'ngram'"),
    ({"method": "ngram", "window": 64}, "apply to method 'self_window'"),
    ({"method": "self_window", "window": 0}, "window"),
    ({"method": "self_window", "acceptance": "greedy"}, "acceptance"),
])
def test_bad_config_is_refused_naming_the_key(tiny_model_dir, bad, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_model_dir("qwen3")), speculative_config=bad)
