"""The engine against hostile input (issue 31): stop lists (3), logprobs beyond the vocabulary (4),
non-finite logits (5). The server's side of each is in tests/server/test_server_hostile.py."""
import math
import random

import pytest

from engine import LLM, SamplingParams, StepError
from engine.core.non_finite import NonFiniteLogits
from engine.sample.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS

NO_EOS = dict(ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)


def _run(llm, *requests):
    """Step until every request is done: {request id: output}, and the StepErrors raised."""
    for rid, prompt, params in requests:
        llm.add_request(prompt, params, request_id=rid)
    outputs, errors = {}, []
    while llm.has_unfinished():
        try:
            outputs.update((o.request_id, o) for o in llm.step())
        except StepError as e:
            errors.append(e)
    return outputs, errors


# -- 3: stop lists --------------------------------------------------------------------------------------
def test_a_stop_list_beyond_the_limits_is_refused():
    SamplingParams(stop=["x"] * MAX_STOP_STRINGS)  # at the limits: taken
    SamplingParams(stop=["x" * MAX_STOP_CHARS])
    with pytest.raises(ValueError, match=f"65 strings .* limit of {MAX_STOP_STRINGS} strings .*MAX_STOP_STRINGS"):
        SamplingParams(stop=[f"s{i}" for i in range(MAX_STOP_STRINGS + 1)])
    with pytest.raises(ValueError, match=f"{MAX_STOP_CHARS + 1} characters in all, beyond"):
        SamplingParams(stop=["x" * 1000, "y" * (MAX_STOP_CHARS - 999)])


class _CountingList(list):
    """A stop list that counts how often it is read through."""
    reads = 0

    def __iter__(self):
        _CountingList.reads += 1
        return super().__iter__()


def test_the_stop_check_does_not_read_the_stop_list_per_token(llm):
    # Per token, the check searches an index built once per request (Aho-Corasick), so its cost does
    # not grow with the list: the list is read as often for 4 tokens as for 40.
    reads = []
    for max_tokens in (4, 40):
        params = SamplingParams(max_tokens=max_tokens, temperature=0, stop=[f"never{i}" for i in range(64)], **NO_EOS)
        params.stop = _CountingList(params.stop)
        _CountingList.reads = 0
        out = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0]
        assert len(out.token_ids) == max_tokens
        reads.append(_CountingList.reads)
    assert reads[0] == reads[1], reads


def test_among_many_stop_strings_the_text_ends_where_the_first_begins(llm):
    free = llm.generate([[9, 10, 11]], SamplingParams(max_tokens=40, temperature=0, **NO_EOS), use_tqdm=False)
    text = free[0].outputs[0].text
    rng = random.Random(0)
    decoys = ["".join(rng.choice("\x01\x02\x03") for _ in range(5)) for _ in range(60)]
    stops = decoys + [text[20:23], text[12:14], text[12:17]]  # the earliest one begins at 12 (or before)
    out = llm.generate([[9, 10, 11]], SamplingParams(max_tokens=40, temperature=0, stop=stops, **NO_EOS),
                       use_tqdm=False)[0].outputs[0]
    cut = min(text.find(s) for s in stops if s in text)
    assert out.finish_reason == "stop" and out.text == text[:cut] and cut <= 12


# -- 4: logprobs beyond the vocabulary ----------------------------------------------------------------------
def test_max_logprobs_above_the_vocabulary_is_refused_at_start(tiny_model_dir):
    with pytest.raises(ValueError, match=r"max_logprobs=257 \(--max-logprobs\) is above the model's vocabulary of 256"):
        LLM(str(tiny_model_dir("llama")), num_kv_blocks=8, max_model_len=64, max_logprobs=257)


def test_logprobs_above_the_vocabulary_are_refused_at_the_request(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=32, max_model_len=64, max_logprobs=256)
    out = llm.generate([[5, 6]], SamplingParams(max_tokens=2, logprobs=256, prompt_logprobs=256, **NO_EOS),
                       use_tqdm=False)[0]  # the whole vocabulary: fine
    assert len(out.outputs[0].logprobs[0]) == 256 and len(out.prompt_logprobs[1]) == 256
    llm.options.max_logprobs = 1000  # as an engine configured before the start-up check
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"{field}=300 is above the model's vocabulary of 256 tokens"):
            llm.add_request([5, 6], SamplingParams(max_tokens=2, **{field: 300}))
    assert not llm.has_unfinished()


# -- 5: NaN or inf logits ----------------------------------------------------------------------------------
def _poison(llm, monkeypatch, request_id: str, value: float, after: int = 2, scored: bool = False):
    """Make the logits of ``request_id``'s rows ``value`` once its children have ``after`` tokens
    (``scored``: its prompt logprobs rows instead)."""
    run = llm.runner.run

    def poisoned(plan):
        logits, rows = run(plan)
        if logits is not None:
            logits = logits.clone()  # an inference tensor cannot be written in place
            for i, seq in enumerate(plan.sample_seqs):
                if seq.request.request_id == request_id and seq.num_generated >= after:
                    logits[i, 7] = value
        if scored and rows is not None:
            at = 0
            for span in plan.scored:
                if span.seq.request.request_id == request_id:
                    rows.logprobs[at] = value
                at += span.count
        return logits, rows
    monkeypatch.setattr(llm.runner, "run", poisoned)


SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.mark.parametrize("value, spec", [(math.nan, None), (math.inf, None), (-math.inf, None), (math.nan, SPEC)],
                         ids=["nan", "inf", "-inf", "nan-speculative"])
def test_non_finite_logits_abort_that_request_alone(llm, tiny_model_dir, monkeypatch, value, spec):
    if spec is not None:  # verified rows: several logits rows per sequence
        llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256, speculative_config=spec)
    good = SamplingParams(n=2, max_tokens=3, seed=5, logprobs=1, **NO_EOS)
    alone, _ = _run(llm, ("alone", [5, 6, 8] * 3, good))
    _poison(llm, monkeypatch, "bad", value)
    outputs, errors = _run(llm, ("bad", [5, 6, 7] * 3, SamplingParams(n=3, max_tokens=8, seed=1, **NO_EOS)),
                           ("good", [5, 6, 8] * 3, good))
    # "good" finished in the step that failed "bad": it comes with the next step, with its own tokens.
    assert list(outputs) == ["good"]
    assert [o.token_ids for o in outputs["good"].outputs] == [o.token_ids for o in alone["alone"].outputs]
    (error,) = errors
    assert isinstance(error.cause, NonFiniteLogits) and "non-finite logits (NaN or inf)" in str(error)
    # Its tokens so far, all drawn from finite logits (those drawn from the poisoned rows are dropped).
    assert set(error.partial) == {"bad"} and all(len(t) >= 2 and reason is None for t, reason in error.partial["bad"])
    if spec is None:
        assert [len(t) for t, _ in error.partial["bad"]] == [2, 2, 2]
    assert llm.block_manager.num_used == 0 and not llm.has_unfinished()


def test_non_finite_prompt_logprobs_abort_that_request_alone(llm, monkeypatch):
    _poison(llm, monkeypatch, "bad", math.nan, after=10 ** 9, scored=True)
    outputs, errors = _run(llm, ("bad", [5, 6, 7, 9], SamplingParams(max_tokens=3, prompt_logprobs=1, **NO_EOS)),
                           ("good", [5, 6, 8, 9], SamplingParams(max_tokens=3, prompt_logprobs=1, **NO_EOS)))
    assert list(outputs) == ["good"] and all(not math.isnan(e[t].logprob) for e, t in zip(
        outputs["good"].prompt_logprobs[1:], [6, 8, 9]))
    assert [set(e.partial) for e in errors] == [{"bad"}] and isinstance(errors[0].cause, NonFiniteLogits)


# -- issue 38, 10: stop_token_ids outside the vocabulary ----------------------------------------------------------
def test_stop_token_ids_outside_the_vocabulary_are_refused_naming_its_size(llm):
    vocab = llm.config.vocab_size
    for bad in (vocab, 10**20):
        with pytest.raises(ValueError, match=f"outside the model's vocabulary of {vocab} tokens"):
            llm.add_request([1, 2, 3], SamplingParams(max_tokens=4, stop_token_ids=[5, bad]))
    assert not llm.has_unfinished()
    _run(llm, ("last-id", [1, 2, 3], SamplingParams(max_tokens=4, stop_token_ids=[vocab - 1])))  # taken
