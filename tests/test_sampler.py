"""Sampler: filters reduce to greedy at their limits; seeded streams are reproducible."""
import pytest
import torch

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Request, Sequence


def _seqs(params: SamplingParams, n: int, device=torch.device("cpu")):
    req = Request("r", None, [1], params)
    return [Sequence(req, i, [1], 1, generator=req.make_generator(i, device)) for i in range(n)]


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(temperature=0)])
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
