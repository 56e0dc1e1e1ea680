"""A failed step, an absurd n, and generate() beside other requests leave the engine usable."""
import hashlib
from array import array

import pytest

from engine import LLM, SamplingParams, StepError
from engine.core.block_manager import block_hash

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = list(range(3, 40))  # 37 tokens: two full 16-token blocks and a partial one


@pytest.fixture
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), num_kv_blocks=32, max_model_len=256)


def _fail_once(llm, when=lambda batch: True):
    run = llm.runner.run

    def flaky(batch):
        if when(batch):
            llm.runner.run = run
            raise RuntimeError("simulated device error")
        return run(batch)
    llm.runner.run = flaky


def test_failed_step_aborts_its_requests_and_the_rest_continue(llm):
    want = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    fresh = LLM(str(llm.config.path), num_kv_blocks=32, max_model_len=256, max_num_seqs=1)
    a = fresh.add_request([9, 8, 7], GREEDY)
    b = fresh.add_request(PROMPT, GREEDY)  # waits: one sequence at a time
    _fail_once(fresh)
    with pytest.raises(StepError) as err:
        fresh.step()
    assert set(err.value.partial) == {a} and isinstance(err.value.cause, RuntimeError)
    assert err.value.partial[a] == [([], None)]
    assert set(fresh.requests) == {b}
    done = []
    while fresh.has_unfinished():
        done += fresh.step()
    assert [o.request_id for o in done] == [b] and done[0].outputs[0].token_ids == want
    assert fresh.block_manager.num_used == 0


def test_blocks_of_a_failed_step_are_not_served_from_the_prefix_cache(llm):
    """The failed prefill registered PROMPT's blocks but never wrote their KV: a later request for
    the same prompt must recompute them, not read stale cache memory."""
    want = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    fresh = LLM(str(llm.config.path), num_kv_blocks=32, max_model_len=256)
    fresh.runner.kv_cache.normal_()  # garbage where a skipped write would leave it
    _fail_once(fresh)
    with pytest.raises(StepError):
        fresh.generate([PROMPT], GREEDY, use_tqdm=False)
    assert not fresh.has_unfinished()
    assert fresh.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want


def test_failure_mid_decode_reports_the_tokens_so_far(llm):
    _fail_once(llm, when=lambda batch: bool(batch.decodes) and batch.decodes[0].num_generated == 3)
    with pytest.raises(StepError) as err:
        llm.generate([PROMPT], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6), use_tqdm=False)
    (rid, partial), = err.value.partial.items()
    assert [len(tokens) for tokens, _ in partial] == [3, 3, 3]
    # nothing computed is lost: resuming gives what an uninterrupted run gives
    resumed = llm.add_request(PROMPT, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6), resume=partial)
    out = [o for o in _drain(llm) if o.request_id == resumed][0]
    assert [c.token_ids[:3] for c in out.outputs] == [tokens for tokens, _ in partial]
    assert all(len(c.token_ids) == 6 for c in out.outputs)


def _drain(llm):
    done = []
    while llm.has_unfinished():
        done += llm.step()
    return done


def test_n_beyond_the_cache_is_refused_and_nothing_is_queued(llm):
    with pytest.raises(ValueError, match=r"n=100000 .* 32 blocks"):
        llm.generate(["hi"], SamplingParams(n=100000, max_tokens=1, temperature=1, seed=1), use_tqdm=False)
    assert not llm.has_unfinished()
    assert len(llm.generate(["hi"], SamplingParams(n=2, max_tokens=2), use_tqdm=False)[0].outputs) == 2


def test_sampling_memory_follows_the_batch_not_n(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=128, max_num_seqs=4)
    rows = []
    sample = llm.sampler.__call__

    class Spy:
        def __call__(self, logits, seqs, *rest):
            rows.append(logits.shape[0])
            return sample(logits, seqs, *rest)
    llm.sampler = Spy()
    out = llm.generate([PROMPT], SamplingParams(n=30, max_tokens=3, temperature=1, seed=1, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs) == 30 and all(len(c.token_ids) == 3 for c in out.outputs)
    assert max(rows) <= 4


def test_generate_keeps_requests_added_before_it(llm):
    early = llm.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                            request_id="0")  # a user id equal to the first automatic one
    outs = llm.generate([PROMPT, [1, 2]], GREEDY, use_tqdm=False)
    assert len(outs) == 2 and "0" not in {o.request_id for o in outs}
    returned = _drain(llm)
    if early not in {o.request_id for o in returned}:  # finished during generate: handed back now
        returned += llm.step()
    assert [o.request_id for o in returned] == ["0"] and len(returned[0].outputs[0].token_ids) == 20


def test_generate_aborts_only_its_own_requests_when_interrupted(llm):
    other = llm.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    step, calls = llm.step, []

    def interrupted():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step()
    llm.step = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate([PROMPT, [1, 2, 3]], SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False)
    del llm.step
    assert set(llm.requests) == {other}
    assert [o.request_id for o in _drain(llm)] == [other]
    assert llm.block_manager.num_used == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(min_p=float("inf")), "min_p must be a finite number"),
    (dict(top_k=float("inf")), "top_k must be an integer"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(max_tokens=2.0), "max_tokens must be an integer"),
    (dict(stop=5), "stop must be a string or a list"),
    (dict(stop_token_ids=[-1]), "stop_token_ids must be token ids"),
])
def test_sampling_params_refuse_non_finite_and_wrong_types(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_prompts_are_value_errors(llm):
    with pytest.raises(ValueError, match="lone surrogates"):
        llm.add_request("bad \ud800 text", GREEDY)
    with pytest.raises(ValueError, match="integer token ids"):
        llm.add_request([1, 2.5], GREEDY)
    assert not llm.has_unfinished()


def test_prefix_hash_is_sha256_of_parent_and_tokens():
    """A cryptographic chain: equal hashes mean equal prefixes, not a 64-bit coincidence."""
    root = block_hash(None, [1, 2, 3])
    assert root == hashlib.sha256(array("q", [1, 2, 3]).tobytes()).digest()
    assert block_hash(root, [4]) == hashlib.sha256(root + array("q", [4]).tobytes()).digest()
    assert block_hash(root, [4]) != block_hash(None, [4])
