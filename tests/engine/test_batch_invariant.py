"""LLM(batch_invariant=True): a token's logits, hence every seeded draw, are the same bits whatever else
is batched, however its prompt is chunked or forked, and across preemption and resume.

Each engine setup is also run without the mode, where the same comparison finds logits that differ in
their last bits (so the bit-exact check below is one that can fail); at temperature 1 such a
difference flips a draw that sits ~1e-7 from a token boundary (test_smollm2_default_mode_flips_draws).
"""
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.sample.sampler import Sampler
from pacore_kernels import prefill_attention_ref, rmsnorm_ref, silu_and_mul_ref
from pacore_kernels.batch_invariant import attention_invariant, linear_invariant, rmsnorm_invariant, silu_and_mul_invariant
from tiny_models import recording_llm


def _ids(n, seed, vocab=256):
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# -- the ops: a row's bits do not depend on its batch-mates ---------------------------------------
def test_linear_rows_do_not_depend_on_the_number_of_rows():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3072, 576, generator=g) * 0.05, torch.randn(3072, generator=g)
    x = torch.randn(70, 576, generator=g)
    whole = linear_invariant(x, w, b)
    torch.testing.assert_close(whole, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    for lo, hi in [(0, 1), (5, 8), (3, 40), (31, 33), (69, 70)]:  # other counts, other tile positions
        assert torch.equal(linear_invariant(x[lo:hi], w, b), whole[lo:hi])


def _paged(lens, bs=16, hkv=2, d=64, dtype=torch.float32, seed=0):
    """Random caches; the last sequence shares the first sequence's first 9 blocks (a fork sibling)."""
    g = torch.Generator().manual_seed(seed)
    nb = [-(-n // bs) for n in lens]
    kc = torch.randn(sum(nb) + 3, bs, hkv, d, generator=g).to(dtype)
    vc = torch.randn(sum(nb) + 3, bs, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(sum(nb) + 3, generator=g)
    tables = torch.zeros(len(lens), max(nb), dtype=torch.int32)
    for i, n in enumerate(nb):
        tables[i, :n] = perm[sum(nb[:i]):sum(nb[:i + 1])]
    tables[-1, :9] = tables[0, :9]
    return kc, vc, tables


def _attend(q, kc, vc, tables, chunks):
    """Queries of chunks [(sequence, first position, count)] in one call; out rows by (seq, pos)."""
    qs = torch.cat([q[s][p:p + n] for s, p, n in chunks])
    cu = torch.tensor([0] + [n for _, _, n in chunks], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    lens = torch.tensor([p + n for _, p, n in chunks], dtype=torch.int32)
    out = attention_invariant(qs, kc, vc, tables[[s for s, _, _ in chunks]], cu, lens, 0.125)
    return dict(zip([(s, p + i) for s, p, n in chunks for i in range(n)], out))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_of_a_query_does_not_depend_on_how_it_is_batched(dtype):
    lens = [300, 1, 17, 140, 230]  # several key tiles, one key, part of one, past a boundary, a sibling
    kc, vc, tables = _paged(lens, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    q = [torch.randn(n, 6, 64, generator=g).to(dtype) for n in lens]  # 3 q heads per kv head
    whole = _attend(q, kc, vc, tables, [(s, 0, n) for s, n in enumerate(lens)])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    ref = prefill_attention_ref(torch.cat(q), kc, vc, tables, cu, torch.tensor(lens, dtype=torch.int32), 0.125)
    torch.testing.assert_close(torch.stack(list(whole.values())), ref, **(
        dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)))
    as_decodes = _attend(q, kc, vc, tables, [(s, p, 1) for s, n in enumerate(lens) for p in range(n)
                                                   if p % 7 == 0 or p == n - 1])
    chunked = {}
    for first in (0, 5, 131, 299):  # chunks of sequence 0 beside decodes of 3 and of 0's sibling 4
        chunked |= _attend(q, kc, vc, tables, [(3, 139, 1), (0, first, min(37, 300 - first)), (4, first // 2, 1)])
    for key, out in (as_decodes | chunked).items():
        assert torch.equal(out, whole[key]), key


def test_rmsnorm_and_silu_rows_do_not_depend_on_the_number_of_rows():
    g = torch.Generator().manual_seed(2)
    x, res, w = torch.randn(91, 1000, generator=g), torch.randn(91, 1000, generator=g), torch.rand(1000, generator=g)
    out, new_res = rmsnorm_invariant(x, w, 1e-6, res)
    want, want_res = rmsnorm_ref(x, w, 1e-6, res)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(new_res, want_res)
    # With 2 threads, F.silu splits 91 x 1000 mid-row 45, whose scalar tail then differs from its
    # vectorised value when computed alone (silu_and_mul_ref: measured, row 45 differs).
    gate_up = torch.randn(91, 2 * 1000, generator=g) * 3
    act = silu_and_mul_invariant(gate_up)
    torch.testing.assert_close(act, silu_and_mul_ref(gate_up), rtol=1e-5, atol=1e-5)
    for lo, hi in [(0, 1), (7, 9), (45, 46), (40, 91)]:
        assert torch.equal(rmsnorm_invariant(x[lo:hi], w, 1e-6, res[lo:hi])[0], out[lo:hi])
        assert torch.equal(silu_and_mul_invariant(gate_up[lo:hi]), act[lo:hi])


def test_sampler_scores_rows_do_not_depend_on_the_other_rows():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50000, generator=g) * 2
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
              SamplingParams(temperature=1.3, top_k=50), SamplingParams(temperature=1.0, min_p=0.05),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0.5)]
    whole = Sampler.scores(logits, params)
    for i in range(6):
        assert torch.equal(Sampler.scores(logits[i:i + 1], params[i:i + 1])[0], whole[i]), i
    # an unfiltered row keeps its whole tail beside a filtered one
    assert torch.equal(Sampler.scores(logits[[0, 1]], params[:2])[0], Sampler.scores(logits[:1], params[:1])[0])


# -- the engine: a seeded request under every change of batch, chunking, fork, preemption, resume --
MAIN = SamplingParams(n=8, temperature=1.0, seed=7, max_tokens=24, ignore_eos=True)
SETUPS = ["max_num_seqs=2", "16 kv blocks (preempted)", "beside other requests", "resumed in a new engine",
          "enable_fork=False", "max_num_batched_tokens=8"]
ENGINE = {"max_num_seqs=2": dict(max_num_seqs=2), "16 kv blocks (preempted)": dict(num_kv_blocks=16),
          "enable_fork=False": dict(enable_fork=False), "max_num_batched_tokens=8": dict(max_num_batched_tokens=8)}


@dataclass(slots=True)
class Run:
    tokens: list[list[int]]
    logits: dict[tuple[int, int], torch.Tensor]  # (child, tokens generated before) -> the row it drew from
    preemptions: int


def _engine(model, batch_invariant, logits, **kw):
    return recording_llm(model, logits, batch_invariant=batch_invariant, **{"num_kv_blocks": 256, **kw})


def _finish(llm, done):
    while llm.has_unfinished():
        done |= {o.request_id: o for o in llm.step()}
    return done


def _run(model, batch_invariant, setup, prompt_len=150) -> Run:
    # 150 + 24 tokens span two key tiles of K_TILE = 128: the first is shared by the 8 forks.
    logits = {}
    llm = _engine(model, batch_invariant, logits, **ENGINE.get(setup, {}))
    prompt = _ids(prompt_len, 1)
    if setup == "beside other requests":
        llm.add_request(_ids(70, 2), SamplingParams(n=3, temperature=0.8, seed=1, max_tokens=30, ignore_eos=True))
    llm.add_request(prompt, MAIN, request_id="main")
    done = {}
    if setup == "beside other requests":
        for _ in range(5):
            done |= {o.request_id: o for o in llm.step()}
        llm.add_request(_ids(20, 3), SamplingParams(n=2, temperature=0, max_tokens=12))  # lands mid-decode
    if setup == "resumed in a new engine":
        for _ in range(10):
            llm.step()
        partial = llm.partial_outputs("main")
        llm = _engine(model, batch_invariant, logits)
        llm.add_request(prompt, MAIN, request_id="main", resume=partial)
    out = _finish(llm, done)["main"]
    return Run([o.token_ids for o in out.outputs], logits, llm.stats()["preemptions"])


@pytest.fixture(scope="module")
def runs(tiny_model_dir):
    cache = {}

    def get(batch_invariant: bool, setup: str, kind: str = "qwen3") -> Run:
        key = (batch_invariant, setup, kind)
        if key not in cache:
            cache[key] = _run(str(tiny_model_dir(kind)), batch_invariant, setup)
        return cache[key]
    return get


@pytest.mark.parametrize("setup", SETUPS)
def test_batch_invariant_draws_and_logits_are_identical(runs, setup):
    ref, got = runs(True, "reference"), runs(True, setup)
    assert got.tokens == ref.tokens
    assert got.logits.keys() == ref.logits.keys() and len(ref.logits) == MAIN.n * MAIN.max_tokens
    assert [k for k in ref.logits if not torch.equal(got.logits[k], ref.logits[k])] == []
    if setup == "16 kv blocks (preempted)":
        assert got.preemptions > 0


@pytest.mark.parametrize("setup", SETUPS)
def test_default_mode_logits_differ_in_the_same_setups(runs, setup):
    ref, got = runs(False, "reference"), runs(False, setup)
    same_history = [(i, k) for i, k in ref.logits
                    if (i, k) in got.logits and got.tokens[i][:k] == ref.tokens[i][:k]]
    differ = [key for key in same_history if not torch.equal(got.logits[key], ref.logits[key])]
    assert differ, f"{setup}: the default path gave bit-identical logits here (measured: it does not on MKL)"


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # tied head, G=2 / qkv bias, G=4
def test_batch_invariant_other_architectures(runs, kind):
    ref = runs(True, "reference", kind)
    for setup in ("16 kv blocks (preempted)", "beside other requests"):
        got = runs(True, setup, kind)
        assert got.tokens == ref.tokens, setup
        assert all(torch.equal(got.logits[k], ref.logits[k]) for k in ref.logits), setup


@pytest.mark.slow
def test_smollm2_default_mode_changes_logits_with_the_batch_and_batch_invariant_does_not():
    """The reported defect on the embedded model: the same seeded request alone and beside another gets
    logits that differ in their last bits by default, so a draw near a tie can differ (the inverse-CDF
    sampler flipped 1 of 8 trajectories at 64 tokens; Gumbel-max draws flip far more rarely), and
    bit-identical logits, so identical tokens, with batch_invariant. The chosen tokens' raw logprobs
    show the logits' bits."""
    llm = LLM("smollm2-135m", num_kv_blocks=512)
    tok = llm.tokenizer
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)
           for text in ("Write a short story about a robot who learns to paint.",
                        "What is 17 * 23? Think step by step.")]
    params = SamplingParams(n=8, temperature=1.0, seed=7, max_tokens=64, ignore_eos=True, logprobs=0)
    differing = {}
    for batch_invariant in (False, True):
        if batch_invariant:
            llm = LLM("smollm2-135m", num_kv_blocks=512, batch_invariant=True)
        alone = llm.generate([ids[0]], params, use_tqdm=False)[0]
        beside = LLM("smollm2-135m", num_kv_blocks=512, batch_invariant=batch_invariant).generate(
            ids, params, use_tqdm=False)[0]
        differing[batch_invariant] = [
            i for i, (a, b) in enumerate(zip(alone.outputs, beside.outputs))
            if a.token_ids != b.token_ids or [x[t].logprob for x, t in zip(a.logprobs, a.token_ids)]
            != [x[t].logprob for x, t in zip(b.logprobs, b.token_ids)]]
    assert differing[True] == []
    assert differing[False], "the default path computed the same logits here (it did not on MKL/AVX-512)"
