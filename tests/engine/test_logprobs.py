"""SamplingParams.logprobs / prompt_logprobs: values against transformers, which rows pay, fork, the
prefix cache, preemption, resume, batch invariance, the processed distribution, and bad input."""
from __future__ import annotations

import pickle

import pytest
import torch

import engine.sample.sampler as sampler_module
from engine import LLM, SamplingParams
from engine.llm import StepError
from engine.sample.logprobs import Logprob, TokenLogprobs

PROMPT = [(11 * i + 5) % 250 + 3 for i in range(57)]  # 3 blocks and a bit: partial last block


def _hf_logprobs(folder, ids: list[int]) -> torch.Tensor:
    """transformers' log_softmax over its logits at every position of ``ids``."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_sampled_and_prompt_logprobs_match_transformers(tiny_model_dir, kind):
    folder = tiny_model_dir(kind)
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24)  # 3 prompt chunks
    params = SamplingParams(n=3, seed=7, max_tokens=8, ignore_eos=True, logprobs=4, prompt_logprobs=3)
    out = llm.generate([PROMPT], params, use_tqdm=False)[0]
    ref = _hf_logprobs(folder, PROMPT)
    prompt_lp = out.prompt_logprobs
    assert len(prompt_lp) == len(PROMPT) and prompt_lp[0] is None
    for j in range(1, len(PROMPT)):
        entry, want = prompt_lp[j], ref[j - 1]
        assert abs(entry[PROMPT[j]].logprob - want[PROMPT[j]].item()) < 1e-4
        assert entry[PROMPT[j]].rank == int((want > want[PROMPT[j]]).sum()) + 1
        top = [t for t in entry if t != PROMPT[j] or entry[t].rank <= 3]
        assert set(top) >= set(want.topk(3).indices.tolist()) - {PROMPT[j]}
        assert len(entry) in (3, 4)
    for child in out.outputs:
        ref = _hf_logprobs(folder, PROMPT + child.token_ids)
        lp = child.logprobs
        assert len(lp) == len(child.token_ids) == 8 and lp.token_ids == child.token_ids
        for j, token in enumerate(child.token_ids):
            want = ref[len(PROMPT) - 1 + j]
            assert abs(lp[j][token].logprob - want[token].item()) < 1e-4
            for (tid, value), (wid, wvalue) in zip(lp.top(j), zip(want.topk(4).indices.tolist(),
                                                                   want.topk(4).values.tolist())):
                assert abs(value - wvalue) < 1e-4 and (tid == wid or abs(value - want[wid].item()) < 1e-6)
        assert child.cumulative_logprob == pytest.approx(sum(lp.logprobs), abs=1e-5)
        assert lp[0][lp.token_ids[0]].decoded_token == llm.tokenizer.decode([lp.token_ids[0]])


def test_rows_that_do_not_ask_cost_nothing(tiny_model_dir, monkeypatch):
    llm = LLM(str(tiny_model_dir("qwen3")), num_kv_blocks=64)
    reduced = []
    real = sampler_module.compute_logprobs
    monkeypatch.setattr(sampler_module, "compute_logprobs", lambda lp, ids, k: reduced.append(lp.shape) or real(lp, ids, k))
    plain = SamplingParams(n=2, seed=1, max_tokens=5, ignore_eos=True)
    outs = llm.generate([PROMPT, PROMPT[:20]], plain, use_tqdm=False)
    assert reduced == [] and all(c.logprobs is None for o in outs for c in o.outputs)
    assert all(o.prompt_logprobs is None for o in outs)
    asking = SamplingParams(n=1, seed=2, max_tokens=5, ignore_eos=True, logprobs=0)
    llm.generate([PROMPT, PROMPT[:20]], [plain, asking], use_tqdm=False)
    assert reduced and all(shape[0] == 1 for shape in reduced)  # the one asking row per step, not the batch


def _scored_positions(llm):
    """Every plan's scored spans: (request id, child, first position, count, prompt)."""
    seen, run = [], llm.runner.run

    def spy(plan):
        seen.extend((s.seq.request.request_id, s.seq.index, s.start, s.count, s.prompt) for s in plan.scored)
        return run(plan)
    llm.runner.run = spy
    return seen


@pytest.mark.parametrize("enable_fork", [True, False])
def test_prompt_logprobs_are_computed_once_for_n_trajectories(tiny_model_dir, enable_fork):
    llm = LLM(str(tiny_model_dir("qwen3")), num_kv_blocks=64, max_num_batched_tokens=20, enable_fork=enable_fork)
    seen = _scored_positions(llm)
    out = llm.generate([PROMPT], SamplingParams(n=4, seed=3, max_tokens=4, prompt_logprobs=1), use_tqdm=False)[0]
    positions = [p for _, _, start, count, prompt in seen if prompt for p in range(start, start + count)]
    assert positions == list(range(len(PROMPT) - 1))  # each once, in order
    assert len(out.prompt_logprobs) == len(PROMPT)


def test_prompt_logprobs_with_a_warm_cache_equal_a_cold_one(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    cold = LLM(model, num_kv_blocks=64).generate([PROMPT], params, use_tqdm=False)[0].prompt_logprobs
    warm = LLM(model, num_kv_blocks=64)
    warm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    hits = warm.stats()["prefix_cache_hit_tokens"]
    warm.generate([PROMPT + [9]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert warm.stats()["prefix_cache_hit_tokens"] > hits  # the cache is warm for this prompt
    hits = warm.stats()["prefix_cache_hit_tokens"]
    again = warm.generate([PROMPT], params, use_tqdm=False)[0].prompt_logprobs
    assert warm.stats()["prefix_cache_hit_tokens"] == hits  # skipped: every position needs its logits
    assert again == cold
    # once a request's prompt logprobs are complete, its later recomputes use the cache again
    llm = LLM(model, num_kv_blocks=64)
    llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    rid = llm.add_request(PROMPT, params)
    assert llm.prompt_logprobs(rid) is None  # not computed yet
    llm.step()
    seq = llm.requests[rid].seqs[0]
    assert llm.prompt_logprobs(rid) == cold and seq.owed_from() == seq.num_tokens


def _ids(n, seed):
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_logprobs_survive_preemption_and_are_never_reported_twice(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    prompt = _ids(30, 9)
    params = SamplingParams(n=6, temperature=1.0, seed=5, max_tokens=40, ignore_eos=True, logprobs=2,
                            prompt_logprobs=1)
    big = LLM(model, num_kv_blocks=512, batch_invariant=True)
    a = big.generate([prompt], params, use_tqdm=False)[0]
    small = LLM(model, num_kv_blocks=8, batch_invariant=True)
    b = small.generate([prompt], params, use_tqdm=False)[0]
    assert small.stats()["preemptions"] > 0
    for x, y in zip(a.outputs, b.outputs):
        assert len(y.logprobs) == len(y.token_ids) == 40
        assert y.logprobs == x.logprobs  # bit for bit under batch_invariant
    assert b.prompt_logprobs == a.prompt_logprobs


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_resumed_logprobs_come_from_the_snapshot_or_are_recomputed(tiny_model_dir, batch_invariant):
    model = str(tiny_model_dir("qwen3"))
    params = SamplingParams(n=3, seed=11, max_tokens=24, ignore_eos=True, logprobs=3)
    opts = dict(num_kv_blocks=128, batch_invariant=batch_invariant)
    whole = LLM(model, **opts).generate([PROMPT], params, use_tqdm=False)[0]
    first = LLM(model, **opts)
    rid = first.add_request(PROMPT, params)
    for _ in range(10):
        first.step()
    partial, logprobs = first.partial_outputs(rid), first.partial_logprobs(rid)
    assert [len(lp) for lp in logprobs] == [len(t) for t, _ in partial] and len(partial[0][0]) > 0
    for given in (logprobs, None, [logprobs[0], None, logprobs[2]]):
        llm = LLM(model, **opts)
        rid = llm.add_request(PROMPT, params, resume=partial, resume_logprobs=given)
        while llm.has_unfinished():
            done = llm.step()
        out = done[0]
        for i, (want, got) in enumerate(zip(whole.outputs, out.outputs)):
            assert got.token_ids == want.token_ids and len(got.logprobs) == len(got.token_ids)
            if given is not None and given[i] is not None:
                assert got.logprobs[:len(given[i])] == given[i]  # the snapshot's, as they were
            if batch_invariant:
                assert got.logprobs == want.logprobs
            else:
                assert got.logprobs.token_ids == want.logprobs.token_ids
                assert max(abs(p - q) for p, q in zip(got.logprobs.logprobs, want.logprobs.logprobs)) < 1e-4


def test_batch_invariant_logprobs_are_identical_whatever_else_is_batched(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    params = SamplingParams(n=4, seed=2, max_tokens=16, ignore_eos=True, logprobs=5, prompt_logprobs=5)
    alone = LLM(model, num_kv_blocks=256, batch_invariant=True)
    ref = alone.generate([PROMPT], params, use_tqdm=False)[0]
    busy = LLM(model, num_kv_blocks=256, batch_invariant=True, max_num_batched_tokens=40)
    busy.add_request(_ids(70, 2), SamplingParams(n=3, seed=1, max_tokens=30, ignore_eos=True, logprobs=1))
    busy.step()
    rid = busy.add_request(PROMPT, params)
    busy.add_request(_ids(20, 3), SamplingParams(n=2, temperature=0, max_tokens=12))
    done = {}
    while busy.has_unfinished():
        done |= {o.request_id: o for o in busy.step()}
    got = done[rid]
    assert [c.logprobs for c in got.outputs] == [c.logprobs for c in ref.outputs]
    assert got.prompt_logprobs == ref.prompt_logprobs


def test_processed_logprobs_are_the_distribution_sampled_from(tiny_model_dir):
    folder = tiny_model_dir("qwen3")
    llm = LLM(str(folder), num_kv_blocks=64, logprobs_mode="processed_logprobs")
    params = SamplingParams(seed=4, temperature=0.7, top_k=5, max_tokens=6, ignore_eos=True, logprobs=8)
    child = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    ref = _hf_logprobs(folder, PROMPT + child.token_ids)
    for j, token in enumerate(child.token_ids):
        scaled = torch.log_softmax(ref[len(PROMPT) - 1 + j] / 0.7, dim=-1)
        top5 = scaled.topk(5)
        want = top5.values - top5.values.logsumexp(0)
        assert abs(child.logprobs[j][token].logprob - want[top5.indices.tolist().index(token)].item()) < 1e-4
        tops = child.logprobs.top(j)
        assert [v for _, v in tops[5:]] == [float("-inf")] * 3  # filtered out
        assert sum(torch.tensor([v for _, v in tops[:5]]).exp().tolist()) == pytest.approx(1, abs=1e-5)


def test_bad_logprobs_requests_are_refused_naming_the_fix(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3")), num_kv_blocks=64, max_logprobs=5)
    with pytest.raises(ValueError, match=r"logprobs=6 is above this engine's max_logprobs=5.*--max-logprobs"):
        llm.add_request(PROMPT, SamplingParams(logprobs=6))
    with pytest.raises(ValueError, match=r"prompt_logprobs=9 is above"):
        llm.add_request(PROMPT, SamplingParams(prompt_logprobs=9))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"SamplingParams.logprobs must be None \(off\) or an integer >= 0"):
            SamplingParams(logprobs=bad)
    params = SamplingParams(n=2, seed=1, max_tokens=8, logprobs=2)
    rid = llm.add_request(PROMPT, params)
    for _ in range(4):
        llm.step()
    partial, lps = llm.partial_outputs(rid), llm.partial_logprobs(rid)
    with pytest.raises(ValueError, match=r"resume_logprobs\[1\] covers"):
        llm.add_request(PROMPT, params, resume=partial, resume_logprobs=[lps[0], lps[1][1:]])
    with pytest.raises(ValueError, match=r"has the top 2 but the request asks for logprobs=3"):
        llm.add_request(PROMPT, SamplingParams(n=2, seed=1, max_tokens=8, logprobs=3), resume=partial,
                        resume_logprobs=lps)
    with pytest.raises(ValueError, match=r"does not ask for logprobs"):
        llm.add_request(PROMPT, SamplingParams(n=2, max_tokens=8), resume=partial, resume_logprobs=lps)
    done = [(partial[0][0], "stop"), partial[1]]
    with pytest.raises(ValueError, match=r"resume\[0\] is finished, so its logprobs cannot be recomputed"):
        llm.add_request(PROMPT, params, resume=done, resume_logprobs=[None, lps[1]])
    llm.abort_request(llm.add_request(PROMPT, params, resume=done, resume_logprobs=lps))  # given: fine
    with pytest.raises(ValueError, match=r"resume_logprobs without resume"):
        llm.add_request(PROMPT, params, resume_logprobs=lps)


def test_a_failed_step_hands_back_the_logprobs_so_far(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64)
    rid = llm.add_request(PROMPT, SamplingParams(n=2, seed=3, max_tokens=20, ignore_eos=True, logprobs=1))
    for _ in range(5):
        llm.step()
    run = llm.runner.run

    def fail(plan):
        llm.runner.run = run
        raise RuntimeError("simulated device error")
    llm.runner.run = fail
    with pytest.raises(StepError) as e:
        llm.step()
    tokens = [t for t, _ in e.value.partial[rid]]
    assert [lp.token_ids for lp in e.value.logprobs[rid]] == tokens and all(len(t) == 5 for t in tokens)


def test_token_logprobs_save_slice_and_pickle(tmp_path):
    from engine.sample.logprobs import LogprobRows
    lp = TokenLogprobs(2, decode=lambda t: f"<{t}>")
    rows = LogprobRows([5, 7], [-0.5, -2.25], [1, 3], [[5, 6], [1, 2]], [[-0.5, -1.0], [-1.5, -2.0]])
    lp.append_row(rows, 0)
    lp.append_row(rows, 1)
    assert lp[0] == {5: Logprob(-0.5, 1, "<5>"), 6: Logprob(-1.0, 2, "<6>")}
    assert lp[1] == {7: Logprob(-2.25, 3, "<7>"), 1: Logprob(-1.5, 1, "<1>"), 2: Logprob(-2.0, 2, "<2>")}
    assert lp[1:].token_ids == [7] and lp[1:].top(0) == [(1, -1.5), (2, -2.0)] and len(lp[5:]) == 0
    torch.save(lp.to_tensors(), tmp_path / "lp.pt")
    back = TokenLogprobs.from_tensors(torch.load(tmp_path / "lp.pt", weights_only=True))
    assert back == lp and back.decode is None
    assert pickle.loads(pickle.dumps(lp)) == lp  # the tokenizer does not travel
    with pytest.raises(ValueError, match="not saved TokenLogprobs"):
        TokenLogprobs.from_tensors({"num_top": torch.tensor(1)})
