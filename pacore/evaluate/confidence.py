"""How confident a trajectory was, from the engine's token logprobs (``pacore run --record-confidence``),
and how that confidence relates to correctness.

Two measures per trajectory, kept in its record beside ``tokens``:

- ``mean_logprob``: the mean, over its positions, of the sampled token's log-probability.
- ``lowest_group_confidence``: DeepConf's (Fu et al., "Deep Think with Confidence", arXiv 2508.15260,
  section 3). The token confidence at position i is C_i = -(1/k) sum_{j=1..k} log P_i(j) over the top-k
  tokens there (high when the distribution is peaked); a group is a window of n consecutive positions
  and its confidence the mean of their C_i; the lowest group confidence is the minimum over every such
  window (a trajectory shorter than n is one group, all of it).

k = 20 and n = 2048 are DeepConf's: its code (facebookresearch/deepconf, deepconf-offline.py) asks vLLM
for ``SamplingParams(logprobs=20)`` and uses ``WINDOW_SIZE = 2048``, with windows of exactly n positions
(helper.py). Two deliberate differences from that code: C_i averages the top k only, as the paper
defines it (the code averages every entry of vLLM's per-position dict, which also holds the sampled
token when it lies outside the top 20), and nothing is rounded (the code rounds to 3 decimals). The
logprobs are the engine's ``logprobs_mode``, by default raw (the model's distribution, as vLLM's default
that DeepConf ran with); under ``processed_logprobs`` the tokens the sampler filtered out are -inf and
are left out of C_i (they have no probability to be confident about).

torch is imported inside the functions that use it: the CLI imports this module (through the records)
and must answer ``--help`` without torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from engine.sample.logprobs import TokenLogprobs

TOP_K = 20  # top logprobs asked per position (SamplingParams.logprobs)
WINDOW = 2048  # positions per group
MEASURES = ("mean_logprob", "lowest_group_confidence")


@dataclass(slots=True, frozen=True)
class Confidence:
    """A trajectory's two measures; None for a trajectory without positions."""

    mean_logprob: float | None
    lowest_group_confidence: float | None


def token_confidence(top_logprobs: torch.Tensor) -> torch.Tensor:
    """C_i per position (float64 [N]) from the top-k logprobs [N, k]; -inf entries are left out."""
    import torch

    top = top_logprobs.to(torch.float64)
    finite = torch.isfinite(top)
    return -torch.where(finite, top, 0.0).sum(dim=-1) / finite.sum(dim=-1).clamp(min=1)


def lowest_group_confidence(conf: torch.Tensor, window: int = WINDOW) -> float | None:
    """The minimum mean of ``conf`` over every ``window`` consecutive positions (the mean of all of
    them when there are fewer); None for none. One float64 cumsum: windows of 2048 over 100k+ positions."""
    import torch

    if window < 1:
        raise ValueError(f"a group is at least 1 position, got a window of {window}")
    n = conf.numel()
    if n == 0:
        return None
    if n <= window:
        return float(conf.to(torch.float64).mean())
    sums = torch.cat([conf.new_zeros(1, dtype=torch.float64), conf.to(torch.float64).cumsum(0)])
    return float(((sums[window:] - sums[:-window]) / window).min())


def measure(chosen: torch.Tensor, top_logprobs: torch.Tensor, window: int = WINDOW) -> Confidence:
    """The measures of one trajectory from its sampled tokens' logprobs [N] and top-k logprobs [N, k]."""
    import torch

    if chosen.numel() == 0:
        return Confidence(None, None)
    return Confidence(float(chosen.to(torch.float64).mean()),
                      lowest_group_confidence(token_confidence(top_logprobs), window))


def trajectory_confidence(logprobs: TokenLogprobs | None, window: int = WINDOW) -> Confidence:
    """The measures of a trajectory from the engine's logprobs of it (``CompletionOutput.logprobs``)."""
    if logprobs is None:
        raise ValueError("the engine returned no logprobs for a trajectory although the round asked for "
                         f"them (SamplingParams(logprobs={TOP_K})); --record-confidence needs an engine that "
                         f"returns CompletionOutput.logprobs")
    if logprobs.num_top < 1:
        raise ValueError(f"the lowest group confidence needs the top logprobs of each position; these have "
                         f"num_top={logprobs.num_top} (ask with SamplingParams(logprobs={TOP_K}))")
    t = logprobs.to_tensors()  # one copy of the flat arrays, instead of a dict per position
    return measure(t["logprobs"], t["top_logprobs"].view(-1, logprobs.num_top), window)


# -- confidence against correctness ----------------------------------------------------------------
def auroc(positives: list[float], negatives: list[float]) -> float | None:
    """The probability that a positive scores above a negative, ties counted half (the rank-based
    AUROC, Mann-Whitney U / (P * N)); None when either class is empty."""
    if not positives or not negatives:
        return None
    scored = sorted([(x, 1) for x in positives] + [(x, 0) for x in negatives])
    rank_sum, i = 0.0, 0
    while i < len(scored):  # a run of equal scores shares the mean of its ranks
        j = i
        while j < len(scored) and scored[j][0] == scored[i][0]:
            j += 1
        rank_sum += sum(label for _, label in scored[i:j]) * (i + 1 + j) / 2
        i = j
    p, n = len(positives), len(negatives)
    return (rank_sum - p * (p + 1) / 2) / (p * n)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def confidence_vs_correctness(pairs: list[tuple[dict, bool]]) -> dict:
    """How the measures of a round's trajectories relate to their correctness.

    ``pairs``: (trajectory record, whether its answer was right) for every graded trajectory of the
    round that has the measures. Per measure: its mean over the correct and over the incorrect ones and
    its AUROC at telling them apart (higher = more confident = predicted right; 0.5 is no signal).
    """
    out: dict = {"correct": sum(ok for _, ok in pairs), "incorrect": sum(not ok for _, ok in pairs)}
    for name in MEASURES:
        right = [float(t[name]) for t, ok in pairs if ok and t.get(name) is not None]
        wrong = [float(t[name]) for t, ok in pairs if not ok and t.get(name) is not None]
        out[name] = {"correct_mean": _mean(right), "incorrect_mean": _mean(wrong), "auroc": auroc(right, wrong)}
    return out
