"""Self-drafting over a windowed KV (speculative_config method "self_window") is exact: coupled acceptance
emits the tokens decoding without speculation draws (greedy and seeded: token for token; unseeded: the
same distribution), rejection acceptance the same distribution; with a window covering the whole context
the draft is the model itself."""
import pytest
import torch

from engine import LLM, SamplingParams
from spec_samples import same_distribution, samples
from test_spec_decode import PENALISED, PROMPTS, _exercised, _tokens

SW = {"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 2, "policy": "fixed"}


def _both(model, prompts, params, spec=SW, **options):
    plain = LLM(str(model), skip_tokenizer_init=True, **options).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(model), skip_tokenizer_init=True, speculative_config=spec, **options)
    return plain, llm.generate(prompts, params, use_tqdm=False), llm


@pytest.mark.parametrize("kind,options", [
    ("qwen3", dict(cascade_attention=True, kv_cache_dtype="fp8_e4m3", quantization="fp8")),  # FP8 KV and weights
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


@pytest.mark.parametrize("options", [{}, dict(quantization="fp8")], ids=["model-dtype", "fp8-weights"])
def test_seeded_sampling_is_identical_bit_for_bit(tiny_model_dir, options):
    params = [SamplingParams(n=4, temperature=1.0, max_tokens=40, seed=1, logprobs=2, ignore_eos=True),
              SamplingParams(n=4, temperature=1.0, max_tokens=40, seed=2, logprobs=2, ignore_eos=True, **PENALISED)]
    plain, spec, llm = _both(tiny_model_dir("qwen3_sharp"), PROMPTS[:2], params, batch_invariant=True, **options)
    assert _tokens(spec) == _tokens(plain)
    assert [[o.logprobs.logprobs for o in r.outputs] for r in spec] == [[o.logprobs.logprobs for o in r.outputs]
                                                                        for r in plain]
    _exercised(llm)


@pytest.mark.parametrize("window", [dict(window=4096), dict(window=1, window_fraction=1.0)])
def test_a_window_over_the_whole_context_drafts_the_model_itself(tiny_model_dir, window):
    """Draft logits equal the verify pass's at the same positions (float noise only), so every greedy draft
    is accepted: a window of 4,096 tokens, or one of a single token that grows to the whole context
    (window_fraction 1)."""
    llm = LLM(str(tiny_model_dir("qwen3")), skip_tokenizer_init=True,
              speculative_config=dict(SW, sink=0) | window)
    drafts, verified = [], []
    run_draft, run = llm.runner.run_draft, llm.runner.run

    def spy_draft(seqs, tokens, offset, *window_args):
        logits = run_draft(seqs, tokens, offset, *window_args)
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


def test_rejection_gives_a_seeded_request_the_same_tokens_alone_and_beside_others(tiny_model_dir):
    """Its draft noise and accept/residual draws come from its own streams, keyed by position."""
    model = str(tiny_model_dir("qwen3_sharp"))
    spec = dict(SW, acceptance="rejection")
    seeded = SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=9, ignore_eos=True, **PENALISED)
    others = SamplingParams(n=4, temperature=1.0, max_tokens=32, ignore_eos=True)
    opts = dict(skip_tokenizer_init=True, batch_invariant=True, speculative_config=spec)
    alone = LLM(model, **opts).generate(PROMPTS[:1], seeded, use_tqdm=False)
    llm = LLM(model, seed=5, **opts)
    beside = llm.generate(PROMPTS, [seeded, others, others], use_tqdm=False)
    assert _tokens(beside)[0] == _tokens(alone)[0]
    _exercised(llm)


@pytest.mark.parametrize("bad,match", [
    ({"method": "self_window", "prompt_lookup_min": 2}, "apply to method 'ngram'"),
    ({"method": "ngram", "window": 64}, "apply to method 'self_window'"),
    ({"method": "self_window", "window": 0}, "window"),
    ({"method": "self_window", "acceptance": "greedy"}, "acceptance"),
])
def test_bad_config_is_refused_naming_the_key(tiny_model_dir, bad, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_model_dir("qwen3")), speculative_config=bad)


def _context_free_copy(src, dst):
    """The model with every attention output projection zeroed: its next token depends on the current
    token only, so a draft over any window is the model itself (acceptance ~1)."""
    import shutil
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        weights = load_file(f)
        for name, w in weights.items():
            if "o_proj" in name:
                w.zero_()
        save_file(weights, f, metadata={"format": "pt"})
    return dst


def test_the_adaptive_depth_speculates_where_it_pays_and_stops_where_it_does_not(tiny_model_dir, tmp_path):
    """On a modelled device where reading KV costs 1000x reading weights, a draft step over a 2-token window
    is nearly free beside a verify pass over every token: with drafts that are right the policy drafts
    as deep as it may; with a random model's (~1% accepted) it turns speculation off by itself, probing
    now and then; with a window over the whole context a draft step costs a plain one and speculation
    cannot win at any acceptance. The tokens are the same every time."""
    device = tmp_path / "kv_bound.json"
    device.write_text('{"attention_bw_eff": 0.001, "step_overhead_s": 0}')
    params = SamplingParams(n=4, temperature=0, max_tokens=40, ignore_eos=True)
    adaptive = dict(SW, policy="adaptive", cost_model=str(device), window=2, sink=0)

    def depths(model, spec):
        plain, spec_out, llm = _both(model, PROMPTS, params, spec=spec)
        assert _tokens(spec_out) == _tokens(plain)
        st = llm.stats()
        return st["spec_decode_depth_steps"], st["spec_decode_acceptance_estimate"]

    right, a = depths(_context_free_copy(tiny_model_dir("qwen3"), tmp_path / "context_free"), adaptive)
    assert a > 0.9 and right[3] > 0.8 * sum(right.values())
    wrong, a = depths(tiny_model_dir("qwen3"), adaptive)
    assert a < 0.2 and wrong[0] > 0.6 * sum(wrong.values()) and wrong.get(1, 0) > 0  # off, with probes
    full, _ = depths(tiny_model_dir("qwen3"), dict(adaptive, window=4096))
    assert full[0] > 0.9 * sum(full.values())
