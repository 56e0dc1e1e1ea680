"""Speculative decoding is exact: with speculative_config the engine emits the tokens decoding without it
draws (greedy and seeded: token for token; unseeded: the same distribution), with everything else on.

Every comparison also checks the stats: drafts were proposed, some accepted and some rejected, so both
paths of verification ran.
"""
import pytest

from engine import LLM, SamplingParams
from engine.spec.config import SpeculativeConfig
from engine.spec.verify import accepted_runs
from engine.spec.ngram import NgramIndex
from spec_samples import same_distribution, samples

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
PROMPTS = [[5, 6, 7, 8, 9, 10] * 3, [11, 12, 13, 14] * 5, list(range(40, 70))]


def _tokens(outs):
    return [[o.token_ids for o in r.outputs] for r in outs]


def _both(model, prompts, params, spec=SPEC, **options):
    """(outputs without speculation, outputs with it, the speculative engine)."""
    plain = LLM(str(model), **options).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(model), speculative_config=spec, **options)
    return plain, llm.generate(prompts, params, use_tqdm=False), llm


def _exercised(llm):
    st = llm.stats()
    assert 0 < st["spec_decode_num_accepted_tokens"] < st["spec_decode_num_draft_tokens"], st
    return st


# -- greedy: token for token ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("options", [
    dict(),
    # fork n=8, the prefix read once per group; FP8 KV and FP8 weights (each token its activation scale)
    dict(cascade_attention=True, kv_cache_dtype="fp8_e4m3", quantization="fp8"),
    dict(num_kv_blocks=14, max_num_seqs=8, batch_invariant=True),  # preemption
], ids=["plain", "cascade-fp8", "preempt-batch_invariant"])
def test_greedy_is_identical(tiny_model_dir, kind, options):
    params = SamplingParams(n=8, temperature=0, max_tokens=32, ignore_eos=True)
    plain, spec, llm = _both(tiny_model_dir(kind), PROMPTS, params, skip_tokenizer_init=True, **options)
    assert _tokens(spec) == _tokens(plain)
    st = _exercised(llm)
    if "num_kv_blocks" in options:
        assert st["preemptions"] > 0
    if options.get("cascade_attention"):
        assert st["cascade_decode_steps"] > 0
    assert st["kv_blocks_used"] == 0  # every block back: rejected drafts' blocks included


def test_greedy_warm_prefix_cache_is_identical_and_caches_the_same_blocks(tiny_model_dir):
    params = SamplingParams(n=4, temperature=0, max_tokens=37, ignore_eos=True)
    model = str(tiny_model_dir("qwen3"))
    plain = LLM(model, skip_tokenizer_init=True)
    spec = LLM(model, skip_tokenizer_init=True, speculative_config=SPEC)
    cold = [_tokens(x.generate(PROMPTS, params, use_tqdm=False)) for x in (plain, spec)]
    warm = [_tokens(x.generate(PROMPTS, params, use_tqdm=False)) for x in (plain, spec)]
    assert cold[0] == cold[1] == warm[0] == warm[1]
    assert spec.stats()["prefix_cache_hit_tokens"] == plain.stats()["prefix_cache_hit_tokens"] > 0
    # the prefix cache holds exactly the blocks of accepted tokens: the same hashes as without speculation
    assert set(spec.block_manager.cached) == set(plain.block_manager.cached)
    assert spec.block_manager.num_used == plain.block_manager.num_used == 0
    _exercised(spec)


def _runs_of(llm):
    """Record the tokens each verified row appended per step (its run), by (child, first position)."""
    runs = {}
    post = llm.scheduler.postprocess

    def spy(plan, rs):
        finished = post(plan, rs)
        for seq, run, _ in rs:
            if len(run) > 2:
                runs[seq.index, seq.num_generated - len(run)] = list(run)
        return finished
    llm.scheduler.postprocess = spy
    return runs


def test_stop_string_and_max_tokens_cut_inside_an_accepted_run(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    probe = LLM(model, speculative_config=SPEC)
    runs = _runs_of(probe)
    full = probe.generate(["abcabcabcabc"], params, use_tqdm=False)[0].outputs[0]
    (_, at), run = next(iter(sorted(runs.items())))  # a step that appended >= 3 tokens at positions at..
    assert full.token_ids[at:at + len(run)] == run
    # max_tokens ends in the middle of that run
    cut = SamplingParams(temperature=0, max_tokens=at + 2, ignore_eos=True)
    plain, spec, _ = _both(model, ["abcabcabcabc"], cut)
    assert _tokens(spec) == _tokens(plain) == [[full.token_ids[:at + 2]]]
    assert spec[0].outputs[0].finish_reason == "length"
    # a stop string that ends at the run's second token (and nowhere before it)
    text = probe.tokenizer.decode(full.token_ids[:at + 2])
    stop = next(text[-k:] for k in range(1, len(text) + 1) if text.find(text[-k:]) == len(text) - k)
    stopped = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, stop=[stop])
    plain, spec, _ = _both(model, ["abcabcabcabc"], stopped)
    assert spec[0].outputs[0].token_ids == plain[0].outputs[0].token_ids == full.token_ids[:at + 2]
    assert spec[0].outputs[0].text == plain[0].outputs[0].text and spec[0].outputs[0].finish_reason == "stop"


# -- seeded sampling: token for token, bit for bit under batch_invariant ---------------------------------
# Penalties see each query's own history, drafts before it included: a penalised request (sampled, and
# greedy) is token for token the same too.
PENALISED = dict(repetition_penalty=1.4, frequency_penalty=0.6, presence_penalty=0.3, logit_bias={7: 2.0, 40: -3.0})


@pytest.mark.parametrize("options", [{}, dict(quantization="fp8")], ids=["model-dtype", "fp8-weights"])
def test_seeded_sampling_is_identical_with_fork_and_preemption(tiny_model_dir, options):
    params = [SamplingParams(n=8, temperature=1.0, max_tokens=48, seed=1, ignore_eos=True),
              SamplingParams(n=8, temperature=1.0, max_tokens=48, seed=2, ignore_eos=True, **PENALISED),
              SamplingParams(n=8, temperature=0, max_tokens=48, ignore_eos=True, **PENALISED)]
    plain, spec, llm = _both(tiny_model_dir("qwen3_sharp"), PROMPTS, params, skip_tokenizer_init=True,
                             batch_invariant=True, num_kv_blocks=24, max_num_seqs=12, **options)
    assert _tokens(spec) == _tokens(plain)
    assert _exercised(llm)["preemptions"] > 0
    assert _tokens(plain)[1] != _tokens(LLM(str(tiny_model_dir("qwen3_sharp")), skip_tokenizer_init=True,
                                         **options).generate(
        PROMPTS[1:2], SamplingParams(n=8, temperature=1.0, max_tokens=48, seed=2, ignore_eos=True),
        use_tqdm=False))[0]  # the penalties change the tokens


def test_penalties_that_forgot_the_drafts_before_a_query_would_be_caught(tiny_model_dir, monkeypatch):
    from engine.sample import penalties
    from engine.spec import verify

    params = [SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=s, ignore_eos=True, **PENALISED) for s in (1, 2, 3)]
    model = tiny_model_dir("qwen3_sharp")
    monkeypatch.setattr(verify, "outputs_before", lambda seqs, offsets, drafts: penalties.outputs_before(seqs))
    plain, spec, _ = _both(model, PROMPTS, params, skip_tokenizer_init=True, batch_invariant=True)
    assert _tokens(spec) != _tokens(plain)


def test_seeded_resume_in_a_new_engine_is_identical(tiny_model_dir):
    model = str(tiny_model_dir("qwen3_sharp"))
    params = SamplingParams(n=8, temperature=1.0, max_tokens=40, seed=11, ignore_eos=True)
    opts = dict(skip_tokenizer_init=True, batch_invariant=True)
    whole = LLM(model, **opts).generate([PROMPTS[1]], params, use_tqdm=False)
    first = LLM(model, speculative_config=SPEC, **opts)
    first.add_request(PROMPTS[1], params, request_id="r")
    for _ in range(9):
        first.step()
    snapshot = first.partial_outputs("r")
    assert any(0 < len(t) < 40 for t, _ in snapshot)
    second = LLM(model, speculative_config=SPEC, **opts)
    second.add_request(PROMPTS[1], params, request_id="r", resume=snapshot)
    out = []
    while second.has_unfinished():
        out += second.step()
    assert _tokens(out) == _tokens(whole)
    _exercised(first)


def test_logprobs_of_accepted_and_bonus_tokens_are_the_target_distribution(tiny_model_dir):
    params = SamplingParams(n=4, temperature=1.0, max_tokens=30, seed=5, logprobs=3, ignore_eos=True)
    plain, spec, llm = _both(tiny_model_dir("qwen3_sharp"), PROMPTS[:2], params, skip_tokenizer_init=True,
                             batch_invariant=True)
    assert _tokens(spec) == _tokens(plain)
    for a, b in zip(plain, spec):
        for x, y in zip(a.outputs, b.outputs):
            assert len(y.logprobs) == len(y.token_ids)
            assert y.logprobs.logprobs == x.logprobs.logprobs  # bit for bit
            assert [y.logprobs[i] for i in range(len(y.token_ids))] == [x.logprobs[i] for i in range(len(x.token_ids))]
    _exercised(llm)


# -- unseeded sampling: the same distribution ------------------------------------------------------
def test_unseeded_sampling_keeps_the_distribution(tiny_model_dir, plain_samples, monkeypatch):
    model = tiny_model_dir("qwen3_sharp")
    spec = dict(SPEC, num_speculative_tokens=3)
    ours, llm = samples(model, spec)
    assert len(plain_samples) == len(ours) == 20_000
    st = _exercised(llm)
    assert st["spec_decode_num_drafts"] > 5_000  # drafts often proposed, often wrong
    assert min(same_distribution(plain_samples, ours)) > 1e-3

    # A wrong rule, accepting every draft, is caught: the test has power.
    from engine.spec import verify

    def accept_every_draft(plan, tokens):
        return [(s, (plan.drafts.get(s.seq_id, []) + run)[:len(plan.drafts.get(s.seq_id, [])) + 1], i)
                for s, run, i in accepted_runs(plan, tokens)]
    monkeypatch.setattr(verify, "accepted_runs", accept_every_draft)
    wrong, _ = samples(model, spec)
    assert max(same_distribution(plain_samples, wrong)) < 1e-3


# -- no leak ----------------------------------------------------------------------------------------
def test_a_long_sampled_run_gives_every_block_back(tiny_model_dir):
    """1,000 steps of sampled speculative decoding under cache pressure, requests added as others end:
    at every step the blocks in use are exactly those the running sequences hold, and at the end all are free."""
    llm = LLM(str(tiny_model_dir("qwen3_sharp")), skip_tokenizer_init=True, num_kv_blocks=24, max_num_seqs=6,
              speculative_config=SPEC)
    params = SamplingParams(n=3, temperature=1.0, max_tokens=120, ignore_eos=True)
    steps, outs, added = 0, [], 0
    while steps < 1000 or llm.has_unfinished():
        if steps < 1000 and len(llm.requests) < 3:
            llm.add_request(PROMPTS[added % 3], params)
            added += 1
        outs += llm.step()
        steps += 1
        bm = llm.block_manager
        assert bm.num_used == len({b for s in llm.scheduler.running for b in s.block_table})
    assert [len(o.token_ids) for r in outs for o in r.outputs] == [120] * 3 * added
    assert llm.block_manager.num_used == 0 and llm.block_manager.num_free == 24
    assert llm.block_manager.num_logical == 0
    assert _exercised(llm)["preemptions"] > 0


# -- the drafter and the config ------------------------------------------------------------------------
def test_ngram_index_prefers_the_longest_match_then_its_own_tokens():
    idx = NgramIndex(n=2)
    prompt = [1, 2, 3, 9, 9, 2, 3, 4]
    idx.add_source(-1, prompt, 0)
    idx.catch_up(-1)
    mine = prompt + [7, 2, 3]
    idx.add_source(0, mine, len(prompt))
    idx.catch_up(0)
    # "2 3" occurs twice in the prompt and neither match extends to "7 2 3": the most recent, continued
    # in the row's own tokens (which start with the prompt)
    assert idx.lookup(0, 3, 4) == ([4, 7, 2], -1)
    sibling = prompt + [5, 7, 2, 3, 8, 8]
    idx.add_source(1, sibling, len(prompt))
    idx.catch_up(1)
    assert idx.lookup(0, 3, 4) == ([8, 8], 1)  # "7 2 3" matches 3 tokens in the sibling: the longest
    mine += [8, 8, 2, 3]
    idx.catch_up(0)
    assert idx.lookup(0, 2, 4) == ([8, 8], 0)  # four 2-token matches of "2 3": its own tokens first


def test_ngram_without_siblings_never_drafts_from_them():
    idx = NgramIndex(n=2, shared=False)
    idx.add_source(-1, [1, 2], 0)
    idx.catch_up(-1)
    idx.add_source(1, [1, 2, 5, 6, 7], 2)
    idx.catch_up(1)
    idx.add_source(0, [1, 2, 9, 5, 6], 2)
    idx.catch_up(0)
    assert idx.lookup(0, 2, 4) == ([], 0)
    shared = NgramIndex(n=2)
    for src, toks in ((-1, [1, 2]), (1, [1, 2, 5, 6, 7]), (0, [1, 2, 9, 5, 6])):
        shared.add_source(src, toks, 0 if src < 0 else 2)
        shared.catch_up(src)
    assert shared.lookup(0, 2, 4) == ([7], 1)


@pytest.mark.parametrize("bad,match", [
    ({"method": "eagle"}, "method"), ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "above"), ({"draft_model": "x"}, "unknown key"),
    ({"lookup_siblings": "yes"}, "lookup_siblings"),
])
def test_bad_config_is_refused_naming_the_key(tiny_model_dir, bad, match):
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.from_dict(bad)
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_model_dir("qwen3")), speculative_config=bad)
