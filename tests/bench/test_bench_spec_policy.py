"""Self-drafting's depth policy on the rehearsal's device model at PaCoRe-8B's shape (no model runs): never
slower than plain decoding by more than its probe budget, at any batch and context, and as fast as the
best fixed depth where speculation pays."""
import pytest

from bench.spec_policy import simulate, sweep
from engine.spec.policy import DepthPolicy


@pytest.mark.parametrize("kv_bytes", [2, 1], ids=["bf16", "fp8"])
def test_the_policy_is_never_slower_than_plain_decoding(kv_bytes):
    results = sweep(kv_bytes, batches=(1, 16, 256), contexts=(1_000, 16_000, 128_000), warmup=1500, steps=1000)
    for (batch, context, a), o in results.items():
        # probes included: at most DepthPolicy.probe_budget (0.2%) of the time, plus a finite run's slack
        assert o.ratio > 0.995, (batch, context, a, o)
        assert o.ratio > 0.97 * o.best, (batch, context, a, o)
    assert results[(16, 128_000, 0.8)].ratio > 2  # long contexts: the draft reads a window, the verify all
    compute_bound = results[(256, 1_000, 0.8)]  # short contexts at full batch: off, however good the drafts
    assert compute_bound.depths[0] > 0.99 * sum(compute_bound.depths.values())


def test_no_probes_where_always_right_drafts_would_not_pay():
    """A draft step that costs a plain one (a window over the whole context) never pays: no probes either."""
    policy = DepthPolicy(4, lambda ctx, n: (0.0, 1.0) if n == 0 else (1.0, 1.0))
    assert {policy.choose([100] * 8) for _ in range(1000)} == {0} and policy.chosen[0] == 1000


def test_speculation_stops_where_the_acceptance_falls_below_its_break_even():
    """Depth 1 pays above an acceptance of 0.007 here; nothing is accepted. The choice follows the estimate
    down (it held depth 1 for good once made at the top of the acceptance's coarse bucket: 0.993x)."""
    near_even = lambda ctx, n: (0.0, 1.0) if n == 0 else (0.005, 1.0 + 0.002 * n)  # noqa: E731
    o = simulate(near_even, batch=256, context=1000, a=0.0, warmup=1500, steps=1000)
    assert o.ratio > 0.998 and o.depths[0] > 0.9 * sum(o.depths.values())


def test_probes_keep_within_their_budget():
    cheap_drafts = lambda ctx, n: (0.0, 1.0) if n == 0 else (0.5, 1.0 + 0.1 * n)  # noqa: E731
    o = simulate(cheap_drafts, batch=4, context=1000, a=0.0, warmup=100, steps=4000)
    budget = DepthPolicy(4, cheap_drafts).probe_budget
    assert 1 / (1 + 2 * budget) < o.ratio < 1 and o.depths[1] > 0
