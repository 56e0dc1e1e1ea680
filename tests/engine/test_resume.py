"""Continuing a request in a new engine from partial_outputs: the same tokens as never stopping."""
import pytest
import torch

from engine import LLM, SamplingParams


def _prompt(n, seed=0):
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run_until(llm, rid, steps):
    for _ in range(steps):
        assert not llm.step()
    return llm.partial_outputs(rid)


def test_a_resumed_request_continues_each_stream_exactly(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    prompt = _prompt(37, seed=3)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=30, stop_token_ids=[7, 9, 13])
    whole = LLM(model, num_kv_blocks=256).generate([prompt], params, use_tqdm=False)[0]

    first = LLM(model, num_kv_blocks=256)
    rid = first.add_request(prompt, params)
    partial = _run_until(first, rid, 12)
    assert [len(t) for t, _ in partial] == [min(12, len(o.token_ids)) for o in whole.outputs]  # 1 per step
    first.abort_request(rid)

    second = LLM(model, num_kv_blocks=256)
    second.add_request(prompt, params, request_id="again", resume=partial)
    done = []
    while second.has_unfinished():
        done += second.step()
    got = done[0]
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in whole.outputs]
    assert [o.finish_reason for o in got.outputs] == [o.finish_reason for o in whole.outputs]
    # the prompt's blocks were computed once and shared by the continuations
    continuing = sum(reason is None for _, reason in partial)
    assert continuing >= 2
    assert second.stats()["prefix_cache_hit_tokens"] >= (continuing - 1) * (37 // 16) * 16


def test_finished_children_are_kept_as_they_were(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=128)
    params = SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=8, ignore_eos=True)
    llm.add_request(_prompt(20), params, request_id="r", resume=[([5, 6, 7], "stop"), ([5], None)])
    out = []
    while llm.has_unfinished():
        out += llm.step()
    a, b = out[0].outputs
    assert (a.token_ids, a.finish_reason) == ([5, 6, 7], "stop")
    assert len(b.token_ids) == 8 and b.token_ids[0] == 5 and b.finish_reason == "length"
    # only the unfinished child ran: prompt + its token prefilled, then 6 decodes for 7 new tokens
    assert (llm.stats()["prefill_tokens"], llm.stats()["decode_tokens"]) == (21, 6)


@pytest.mark.parametrize("resume,match", [
    ([([1], None)], "resume has 1 children but the request has n=2"),
    ([([1] * 9, "length"), ([], None)], "beyond max_tokens=8"),
    ([([1] * 8, None), ([], None)], "beyond max_tokens=8"),
    ([([10**9], None), ([], None)], "outside the vocabulary"),
    ([([1], "eos"), ([], None)], "finish reason must be"),
    ([([1], "stop"), ([2], "length")], "every child is already finished"),
])
def test_bad_resume_is_refused(tiny_model_dir, resume, match):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64)
    with pytest.raises(ValueError, match=match):
        llm.add_request(_prompt(10), SamplingParams(n=2, max_tokens=8), resume=resume)
    assert not llm.has_unfinished()


def test_a_resumed_request_reports_the_prompt_sharing_a_fork_would(tiny_model_dir):
    """Resumed children are recomputed, not forked, yet share the prompt through the prefix cache: the
    request's KV-saved and cache-hit figures say so as the uninterrupted request's do (issue 52, item 6:
    they were 0, so a resumed PaCoRe round's summary lost them)."""
    model = str(tiny_model_dir("qwen3"))
    prompt = _prompt(53, seed=5)
    params = SamplingParams(n=4, temperature=1.0, seed=2, max_tokens=40, ignore_eos=True)
    first = LLM(model, num_kv_blocks=256)
    rid = first.add_request(prompt, params)
    partial = _run_until(first, rid, 6)
    first.abort_request(rid)
    whole = LLM(model, num_kv_blocks=256).generate([prompt], params, use_tqdm=False)[0]

    second = LLM(model, num_kv_blocks=256)
    second.generate([prompt[:40]], SamplingParams(max_tokens=1), use_tqdm=False)  # 2 blocks now cached
    second.add_request(prompt, params, request_id="again", resume=partial)
    done = []
    while second.has_unfinished():
        done += second.step()
    got = done[0]
    assert got.metrics.kv_blocks_saved_by_sharing == whole.metrics.kv_blocks_saved_by_sharing == 3 * (53 // 16)
    assert got.num_cached_tokens == 32  # the first child's prompt hit, as a fresh request's
