"""Sampler: filters reduce to greedy at their limits; seeded streams are reproducible."""
import pytest
import torch

from engine.sample.sampler import Sampler
from engine.sample.sampling_params import SamplingParams
from engine.core.sequence import Request, Sequence


def _seqs(params: SamplingParams, n: int, device=torch.device("cpu")):
    req = Request("r", None, [1], params)
    return [Sequence(req, i, [1], 1, stream=req.stream(i)) for i in range(n)]


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(temperature=0),
                                dict(temperature=1e-320), dict(temperature=1e-6)])  # would overflow: greedy
def test_limits_reduce_to_greedy(kw):
    logits = torch.randn(16, 1000)
    params = SamplingParams(**{"temperature": 1.0, **kw})
    assert Sampler(torch.device("cpu"))(logits, _seqs(params, 16)) == logits.argmax(-1).tolist()


def test_top_k_and_top_p_keep_only_allowed_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(400, 1)
    s = Sampler(torch.device("cpu"), seed=1)
    assert set(s(logits, _seqs(SamplingParams(top_k=2), 400))) == {0, 1}
    probs = torch.softmax(logits[0], -1)  # top_p just above p0 + p1 keeps exactly three tokens
    tp = float(probs[:2].sum()) + 1e-3
    assert set(s(logits, _seqs(SamplingParams(top_p=tp), 400))) == {0, 1, 2}


def test_top_k_keeps_every_token_tied_with_the_kth_as_vllm():
    # vLLM keeps every logit >= the k-th largest (issue 47): [3, 2, 2, 2, 1, 0] with top_k 2 keeps four.
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    kept = Sampler.probs(logits, [SamplingParams(top_k=2)]) > 0
    assert kept.tolist() == [[True, True, True, True, False, False]]
    drawn = Sampler(torch.device("cpu"), seed=2)(logits.repeat(400, 1), _seqs(SamplingParams(top_k=2), 400))
    assert set(drawn) == {0, 1, 2, 3}


@pytest.mark.parametrize("top_k", [0, -1, 10 ** 6])  # 0 is off, as vLLM documents; beyond the vocabulary: all
def test_top_k_off_or_past_the_vocabulary_keeps_every_token(top_k):
    logits = torch.randn(3, 50)
    assert bool((Sampler.probs(logits, [SamplingParams(top_k=top_k)] * 3) > 0).all())


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(6000, 1)
    got = torch.tensor(Sampler(torch.device("cpu"), seed=3)(logits, _seqs(SamplingParams(), 6000)))
    freq = torch.bincount(got, minlength=3).float() / 6000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.03, rtol=0)


def test_seeded_children_reproducible_and_distinct():
    logits = torch.randn(4, 5000)
    params = SamplingParams(seed=42)
    a = Sampler(torch.device("cpu"), seed=0)(logits, _seqs(params, 4))
    b = Sampler(torch.device("cpu"), seed=99)(logits, _seqs(params, 4))  # engine seed is irrelevant
    assert a == b
    same_logits = logits[:1].repeat(4, 1)
    draws = Sampler(torch.device("cpu"))(same_logits, _seqs(params, 4))
    assert len(set(draws)) > 1


def test_a_seeded_draw_depends_on_position_not_on_the_batch():
    logits = torch.randn(6, 3000)
    params = SamplingParams(seed=7)
    seqs = _seqs(params, 6)
    together = Sampler(torch.device("cpu"))(logits, seqs)
    alone = [Sampler(torch.device("cpu"))(logits[i:i + 1], [seqs[i]])[0] for i in range(6)]
    assert together == alone
    seqs[0].token_ids.append(5)  # one more generated token: the next draw of that stream
    assert Sampler(torch.device("cpu"))(logits[:1].repeat(200, 1), [seqs[0]] * 200) == \
        [Sampler(torch.device("cpu"))(logits[:1], [seqs[0]])[0]] * 200


def test_stream_keys_are_distinct_per_child_and_position():
    from engine.sample.rng import stream_key

    keys = [stream_key(s, k) for s in (1, 2, 3) for k in range(4000)]
    assert len(set(keys)) == len(keys) and all(-2 ** 63 <= k < 2 ** 63 for k in keys)


def test_the_same_key_draws_the_same_token_and_greedy_rows_ignore_it():
    logits = torch.randn(3, 2000)
    seqs = _seqs(SamplingParams(temperature=1.0), 2) + _seqs(SamplingParams(temperature=0), 1)
    s = Sampler(torch.device("cpu"))
    keys = s.keys(seqs)
    assert s(logits, seqs, keys=keys) == s(logits, seqs, keys=keys)
    assert s(logits, seqs, keys=keys)[2] == int(logits[2].argmax())


def test_a_stop_string_found_when_its_characters_span_many_byte_tokens():
    from engine.core.stopping import StopChecker

    class ByteTokenizer:  # one token per UTF-8 byte, as byte-level BPE can produce for rare characters
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")
    stop = "\U0001F600!"  # 2 characters, 5 bytes, so 5 tokens
    text = list("thinking ".encode()) + list(stop.encode())
    req = Request("r", None, [1], SamplingParams(stop=[stop], max_tokens=100))
    seq = Sequence(req, 0, [1], 1)
    checker = StopChecker(ByteTokenizer(), [], 1000)
    reasons = []
    for t in text:
        seq.token_ids.append(t)
        reasons.append(checker.check(seq))
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}


@pytest.mark.parametrize("top_p", [5e-324, 1e-300, 1e-46, 7e-46, 7.1e-46, 1.4e-45, 1e-38, 1.1754942e-38])
def test_a_tiny_top_p_keeps_the_top_token_at_the_edges_of_float32(top_p):
    # Below ~7e-46 top_p rounds to 0 in float32, and no token was kept: every draw was the last id.
    logits = torch.randn(32, 1000)
    params = SamplingParams(top_p=top_p, seed=3)
    assert Sampler(torch.device("cpu"))(logits, _seqs(params, 32)) == logits.argmax(-1).tolist()
    mixed = [_seqs(params, 16)[i] if i % 2 else _seqs(SamplingParams(top_p=1.0), 16)[i] for i in range(16)]
    draws = Sampler(torch.device("cpu"))(logits[:16], mixed)  # beside unfiltered rows too
    assert draws[1::2] == logits[:16].argmax(-1).tolist()[1::2]


def _penalised_by_hand(row, p, prompt, output):
    """One row, token by token, in vLLM's order: logit_bias, repetition, frequency, presence."""
    row = row.clone()
    for t, b in (p.logit_bias or {}).items():
        row[t] += b
    for t in set(prompt) | set(output):
        row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t in set(output):
        row[t] = row[t] - p.frequency_penalty * output.count(t)
        row[t] = row[t] - p.presence_penalty
    return row


def test_penalties_and_logit_bias_are_the_token_by_token_rule_on_their_rows_only():
    from engine.sample.penalties import outputs_before, penalize

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=g) * 3
    kinds = [SamplingParams(), SamplingParams(repetition_penalty=1.3, seed=1),
             SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4, temperature=0),
             SamplingParams(logit_bias={3: 5.0, 7: -100}, repetition_penalty=0.8, frequency_penalty=2),
             SamplingParams(presence_penalty=1.5)]
    seqs = []
    for i, p in enumerate(kinds):
        req = Request(str(i), None, [1, 2, 3, 9], p)
        seqs.append(Sequence(req, 0, [1, 2, 3, 9, 4, 4, 9, 12, 4], 4, stream=req.stream(0)))
    drafts = {seqs[4].seq_id: [30, 4, 31]}
    offsets = [0, 0, 0, 0, 2]  # entry 4: a speculative query, after two of its drafts
    out = penalize(logits, seqs, outputs_before(seqs, offsets, drafts))
    assert torch.equal(out[0], logits[0])  # no penalty: the row untouched
    for i in range(1, 5):
        output = seqs[i].generated + (drafts[seqs[i].seq_id][:2] if i == 4 else [])
        assert torch.equal(out[i], _penalised_by_hand(logits[i], kinds[i], [1, 2, 3, 9], output)), i
    assert not torch.equal(out[4], penalize(logits, seqs, outputs_before(seqs))[4])  # the drafts count
    greedy = Sampler(torch.device("cpu"))(out[2:3], seqs[2:3])
    assert greedy == [int(out[2].argmax())]  # a greedy request takes its argmax after the penalties


def test_top_p_applies_to_the_top_k_survivors_renormalised():
    # The case: top_k=8 and top_p=0.9 keep 8 tokens with top-p over the whole distribution,
    # 7 with vLLM's and transformers' order (top-p over the 8, renormalised).
    probs = torch.tensor([0.3, 0.2, 0.1, 0.08, 0.06, 0.05, 0.05, 0.04] + [0.12 / 92] * 92)
    logits = probs.log()[None, :]
    kept = Sampler.probs(logits, [SamplingParams(top_k=8, top_p=0.9)]) > 0
    top8 = probs[:8] / probs[:8].sum()
    before = top8.cumsum(0) - top8
    assert int(kept.sum()) == int((before < 0.9).sum()) == 7
    assert int((probs.cumsum(0) - probs < 0.9)[:8].sum()) == 8  # the old rule's count
    draws = Sampler(torch.device("cpu"))(logits.repeat(300, 1), _seqs(SamplingParams(top_k=8, top_p=0.9), 300))
    assert set(draws) == set(range(7))
    # min-p first too: 0.25 * 0.3 drops every token after the fourth, and top-p sees those four
    kept = Sampler.probs(logits, [SamplingParams(min_p=0.25, top_p=0.8)]) > 0
    four = probs[:4] / probs[:4].sum()
    assert int(kept.sum()) == int((four.cumsum(0) - four < 0.8).sum()) == 3


def test_rows_that_sample_draw_what_the_whole_batch_drew():
    from pacore_kernels.gumbel_sample import gumbel_noise_ref

    logits = torch.randn(6, 700)
    seqs = [_seqs(SamplingParams(temperature=t, seed=s), 1)[0]
            for t, s in [(0, None), (0.7, 3), (1.0, 4), (0, 5), (1.3, 6), (0, None)]]
    s = Sampler(torch.device("cpu"))
    keys = s.keys(seqs)
    temps = torch.tensor([sq.params.temperature or 1.0 for sq in seqs])
    plain = (gumbel_noise_ref(keys, 700) + logits / temps[:, None]).argmax(-1)
    expected = [int(logits[i].argmax()) if sq.params.greedy else int(plain[i]) for i, sq in enumerate(seqs)]
    assert s(logits, seqs, keys=keys) == expected


def test_processed_logprobs_are_of_the_penalised_distribution(tiny_model_dir):
    from engine import LLM

    llm = LLM(str(tiny_model_dir("llama")), skip_tokenizer_init=True, logprobs_mode="processed_logprobs",
              num_kv_blocks=16, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1, repetition_penalty=3.0,
                            frequency_penalty=2.0, logit_bias={5: 1.5})
    out = llm.generate([[7, 8, 9, 7, 8, 9]], params, use_tqdm=False)[0].outputs[0]
    lp = out.logprobs
    assert len(set(out.token_ids)) > 3  # the penalties at work: no token repeated over and over
    for i, t in enumerate(out.token_ids):  # greedy draws the top of the distribution recorded
        assert lp.top(i)[0][0] == t and lp.logprobs[i] == lp.top(i)[0][1]
