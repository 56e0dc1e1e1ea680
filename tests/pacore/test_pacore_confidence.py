"""--record-confidence's measures (evaluate/confidence.py) on hand-computed values."""
import math

import pytest
import torch

from pacore.evaluate.confidence import (Confidence, auroc, confidence_vs_correctness, lowest_group_confidence,
                                        measure, token_confidence, trajectory_confidence)
from pacore_fakes import fake_logprobs


def test_token_confidence_is_minus_the_mean_top_k_logprob():
    top = torch.tensor([[-0.1, -2.0, -3.9], [-1.0, -1.0, -1.0]])
    assert token_confidence(top).tolist() == pytest.approx([2.0, 1.0])
    # a token the sampler filtered out (processed_logprobs: -inf) has no say
    assert token_confidence(torch.tensor([[-0.5, -1.5, -math.inf]])).tolist() == [1.0]


def test_lowest_group_confidence_slides_a_window_of_n_positions():
    conf = torch.tensor([3.0, 1.0, 2.0, 6.0, 0.5, 0.5])
    # windows of 2: 2, 1.5, 4, 3.25, 0.5 -> 0.5; of 3: 2, 3, 2.8333, 2.3333 -> 2; of 6: one, the mean
    assert lowest_group_confidence(conf, 2) == 0.5
    assert lowest_group_confidence(conf, 3) == pytest.approx(2.0)
    assert lowest_group_confidence(conf, 6) == pytest.approx(13 / 6)
    # shorter than the window: one group, the whole trajectory
    assert lowest_group_confidence(conf, 2048) == pytest.approx(13 / 6)
    assert lowest_group_confidence(torch.tensor([]), 4) is None
    with pytest.raises(ValueError, match="at least 1 position"):
        lowest_group_confidence(conf, 0)


def test_the_cumsum_matches_the_windows_one_by_one_over_a_long_trajectory():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(10_000, generator=g, dtype=torch.float64) * 20
    exact = min(float(conf[i:i + 2048].mean()) for i in range(10_000 - 2048 + 1))
    assert lowest_group_confidence(conf) == pytest.approx(exact, rel=1e-12)


def test_measures_of_a_trajectory():
    chosen = torch.tensor([-0.5, -1.0, -1.5])
    top = torch.tensor([[-0.5, -3.5], [-1.0, -2.0], [-1.5, -2.5]])  # C = 2, 1.5, 2
    assert measure(chosen, top, window=2) == Confidence(-1.0, 1.75)
    assert measure(chosen, top) == Confidence(-1.0, pytest.approx(11 / 6))
    assert measure(torch.tensor([]), torch.zeros(0, 2)) == Confidence(None, None)


def test_from_the_engines_token_logprobs():
    lp = fake_logprobs("abc", 4)
    chosen = torch.tensor([d[t].logprob for d, t in zip(lp, lp.token_ids)], dtype=torch.float64)
    conf = torch.tensor([-sum(v for _, v in lp.top(i)) / 4 for i in range(3)], dtype=torch.float64)
    got = trajectory_confidence(lp)
    assert got.mean_logprob == pytest.approx(float(chosen.mean()))
    assert got.lowest_group_confidence == pytest.approx(float(conf.mean()))
    assert trajectory_confidence(lp, window=1).lowest_group_confidence == pytest.approx(float(conf.min()))
    with pytest.raises(ValueError, match="returned no logprobs"):
        trajectory_confidence(None)
    with pytest.raises(ValueError, match="num_top=0"):
        trajectory_confidence(fake_logprobs("abc", 0))


def test_auroc_counts_ties_half():
    assert auroc([3.0, 4.0], [1.0, 2.0]) == 1.0
    assert auroc([1.0, 2.0], [3.0, 4.0]) == 0.0
    assert auroc([1.0], [1.0]) == 0.5
    # pairs (pos, neg): (2,1) win, (2,2) tie, (2,3) loss, (3,1) win, (3,2) win, (3,3) tie -> 4/6
    assert auroc([2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(4 / 6)
    assert auroc([], [1.0]) is None and auroc([1.0], []) is None


def test_confidence_against_correctness():
    t = [{"mean_logprob": -0.2, "lowest_group_confidence": 9.0},
         {"mean_logprob": -0.4, "lowest_group_confidence": 7.0},
         {"mean_logprob": -0.9, "lowest_group_confidence": 8.0},
         {"mean_logprob": None, "lowest_group_confidence": None}]  # no positions: counted, not measured
    got = confidence_vs_correctness([(t[0], True), (t[1], False), (t[2], False), (t[3], False)])
    assert (got["correct"], got["incorrect"]) == (1, 3)
    assert got["mean_logprob"] == {"correct_mean": -0.2, "incorrect_mean": pytest.approx(-0.65), "auroc": 1.0}
    assert got["lowest_group_confidence"] == {"correct_mean": 9.0, "incorrect_mean": 7.5, "auroc": 1.0}
    one_class = confidence_vs_correctness([(t[0], True)])
    assert one_class["mean_logprob"]["auroc"] is None and one_class["incorrect"] == 0
