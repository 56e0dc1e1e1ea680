"""Self-drafting over a windowed KV (speculative_config method "self_window") is exact: coupled acceptance
emits the tokens decoding without speculation draws (greedy and seeded: token for token; unseeded: the
same distribution), rejection acceptance the same distribution; with a window covering the whole context
the draft is the model itself. Each identity holds for every draft-KV policy: the sink + window, and the
sparse ones (``selected``: the blocks between chosen by their key bounds, or with ``selection`` "verify" by
the last verify pass's attention), whose runs here are checked to have cut rows' tables (verify: rows
already verified, so the importance chose their blocks); and with layer skipping (``draft_layers``: a draft
step runs some of the layers)."""
import dataclasses

import pytest
import torch

from engine import LLM, SamplingParams
from spec_samples import same_distribution, samples
from test_spec_decode import PENALISED, PROMPTS, _exercised, _tokens

SW = {"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 2, "policy": "fixed"}
# sparse: blocks of 4, so these short runs pass the 1 sink + 2 selected + 2 recent blocks a draft step reads
SPARSE = (dict(SW, window=8, sink=2, selected=8), dict(block_size=4))
# layer skipping on the 2-layer tiny models: the last layer alone (layer 0's draft slots never written), or
# with sparse drafting the first alone (a count: the default choice of 1 of 2 layers)
POLICIES = pytest.mark.parametrize("policy", ["window", "sparse", "layers", "sparse-layers", "verify"])


def _policy(policy: str, spec: dict, options: dict) -> tuple[dict, dict]:
    if policy.endswith("layers"):
        spec, options = _policy(policy.removesuffix("layers").rstrip("-") or "window", spec, options)
        return spec | {"draft_layers": 1 if policy.startswith("sparse") else [1]}, options
    if policy == "window":
        return spec, options
    if "num_kv_blocks" in options:  # the same cache in tokens, in blocks of 4 instead of 16
        options = options | dict(num_kv_blocks=options["num_kv_blocks"] * 4)
    spec = spec | {k: v for k, v in SPARSE[0].items() if k in ("window", "sink", "selected")}
    return spec | ({"selection": "verify"} if policy == "verify" else {}), options | SPARSE[1]


_SPIED: list[list[int]] = [[]]  # the list the current verify-selection spy counts into


def _spy_importance() -> None:
    """Wrap select_by_importance once: per call, the rows the importance of a verify pass cut."""
    import engine.worker.attention as attention
    real = attention.select_by_importance
    if getattr(real, "spy", False):
        return

    def by_importance(importance, tables, lens, bs, sink_b, top_k, recent_b):
        out = real(importance, tables, lens, bs, sink_b, top_k, recent_b)
        _SPIED[0].append(int((((lens + bs - 1) // bs > sink_b + top_k + recent_b) & (out[2] == 0)).sum()))
        return out
    by_importance.spy = True
    attention.select_by_importance = by_importance


def spy_selection(llm) -> list[int]:
    """Per sparse draft step, the rows whose tables the selection cut (the others read every block); with
    selection "verify", those whose importance came from a verify pass."""
    cut, ops = [], llm.runner.window_ops
    if llm.runner.verify_select:
        _spy_importance()
        _SPIED[0] = cut
        return cut

    def select(q, bounds, tables, lens, bs, sink_b, top_k, recent_b):
        cut.append(int(((lens + bs - 1) // bs > sink_b + top_k + recent_b).sum()))
        return ops.select_blocks(q, bounds, tables, lens, bs, sink_b, top_k, recent_b)
    llm.runner.window_ops = dataclasses.replace(ops, select_blocks=select)
    return cut


def _both(model, prompts, params, spec=SW, **options):
    plain = LLM(str(model), skip_tokenizer_init=True, **options).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(model), skip_tokenizer_init=True, speculative_config=spec, **options)
    cut = spy_selection(llm) if spec.get("selected") else None
    out = llm.generate(prompts, params, use_tqdm=False)
    if cut is not None and not options.get("batch_invariant"):  # its verify runs as prefill chunks: no importance
        assert sum(cut) > 0, "no sparse draft step cut a table: the test would not exercise selection"
    return plain, out, llm


@pytest.mark.parametrize("kind,options", [
    ("qwen3", dict(cascade_attention=True, kv_cache_dtype="fp8_e4m3", quantization="fp8")),  # FP8 KV and weights
    ("llama", dict(num_kv_blocks=14, max_num_seqs=8)),  # preemption
], ids=["qwen3-cascade-fp8", "llama-preempt"])
@POLICIES
def test_greedy_is_identical(tiny_model_dir, kind, options, policy):
    params = SamplingParams(n=4, temperature=0, max_tokens=32, ignore_eos=True)
    spec, options = _policy(policy, SW, options)
    plain, spec, llm = _both(tiny_model_dir(kind), PROMPTS, params, spec, **options)
    assert _tokens(spec) == _tokens(plain)
    st = _exercised(llm)
    assert st["kv_blocks_used"] == 0
    if "num_kv_blocks" in options:
        assert st["preemptions"] > 0


def test_verify_selection_with_rejection_is_greedy_identical_through_preemption(tiny_model_dir):
    """Rejection acceptance at temperature 0 keeps the greedy tokens too; the importance of a preempted
    row is forgotten, and it drafts over its window until its next verify."""
    params = SamplingParams(n=4, temperature=0, max_tokens=32, ignore_eos=True)
    spec, options = _policy("verify", SW | {"acceptance": "rejection"}, dict(num_kv_blocks=14, max_num_seqs=8))
    plain, out, llm = _both(tiny_model_dir("llama"), PROMPTS, params, spec, **options)
    assert _tokens(out) == _tokens(plain)
    assert llm.runner.key_bounds is None and _exercised(llm)["preemptions"] > 0


@pytest.mark.parametrize("options", [{}, dict(quantization="fp8"), dict(kv_cache_dtype="fp8_e4m3")],
                         ids=["model-dtype", "fp8-weights", "fp8-kv"])
@POLICIES
def test_seeded_sampling_is_identical_bit_for_bit(tiny_model_dir, options, policy):
    params = [SamplingParams(n=4, temperature=1.0, max_tokens=40, seed=1, logprobs=2, ignore_eos=True),
              SamplingParams(n=4, temperature=1.0, max_tokens=40, seed=2, logprobs=2, ignore_eos=True, **PENALISED)]
    spec, options = _policy(policy, SW, options)
    plain, spec, llm = _both(tiny_model_dir("qwen3_sharp"), PROMPTS[:2], params, spec, batch_invariant=True,
                             **options)
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

    def spy_draft(seqs, tokens, offset, *window_args, **window_kwargs):
        logits = run_draft(seqs, tokens, offset, *window_args, **window_kwargs)
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
    ({"method": "self_window", "selected": -16}, "selected"),
    ({"method": "self_window", "selected": 1.5}, "selected"),
    ({"method": "ngram", "selected": 64}, "apply to method 'self_window'"),
    ({"method": "self_window", "selected": 64, "window_fraction": 0.05}, "window_fraction and selected"),
    ({"method": "self_window", "selection": "verify"}, "selection 'verify'"),
    ({"method": "self_window", "selected": 64, "selection": "quest"}, "selection"),
    ({"method": "ngram", "selection": "verify"}, "apply to method 'self_window'"),
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


@pytest.mark.parametrize("options", [dict(cascade_attention=True), dict(num_kv_blocks=14, max_num_seqs=8)],
                         ids=["fork-cascade", "preempt"])
def test_sparse_drafting_keeps_every_blocks_key_bounds(tiny_model_dir, options):
    """Before every draft step, each layer's bounds of each block a row has computed hold every key the
    cache has there: fork's copied blocks, prefix-cache hits, preemption and verify passes included (the
    identity tests cannot see bounds that went stale: they would only pick worse blocks)."""
    spec, options = _policy("sparse", SW, options)
    llm = LLM(str(tiny_model_dir("llama")), skip_tokenizer_init=True, speculative_config=spec, **options)
    runner, bs, checked = llm.runner, llm.block_size, []
    run_draft = runner.run_draft

    def spy_draft(seqs, tokens, offset, *window_args, **window_kwargs):
        kv, bounds = runner.kv_cache, runner.key_bounds
        for s in seqs:
            blocks = torch.tensor(s.block_table[:s.num_computed // bs])
            keys = kv[:, 0, blocks]                                  # [L, n, bs, Hkv, D]
            assert (bounds[:, 0, blocks] <= keys.amin(2)).all() and (bounds[:, 1, blocks] >= keys.amax(2)).all()
            checked.append(len(blocks))
        return run_draft(seqs, tokens, offset, *window_args, **window_kwargs)
    runner.run_draft = spy_draft
    llm.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=0, ignore_eos=True),
                 use_tqdm=False)
    assert sum(checked) > 100
    if "num_kv_blocks" in options:
        assert llm.stats()["preemptions"] > 0
