"""The self-drafting depth policy: speculation where it pays, none where it does not, decided from the
acceptance it measures and the costs it is given."""
import pytest

from engine.spec.policy import DepthPolicy, tokens_per_verify


def _costs(weights_s=0.005, per_kv_token_s=1e-8, window=528):
    """A bandwidth-bound device: every pass reads the weights, a draft step the window, a verify or plain
    step every token (the queries ride along)."""
    def step_seconds(ctx, n):
        full = weights_s + per_kv_token_s * sum(ctx)
        return (0.0, full) if n == 0 else (weights_s + per_kv_token_s * sum(min(c, window) for c in ctx), full)
    return step_seconds


def test_tokens_per_verify():
    assert tokens_per_verify(0.0, 4) == 1.0
    assert tokens_per_verify(1.0, 4) == 5.0
    assert tokens_per_verify(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)


def test_long_contexts_speculate_deep_short_ones_not_at_all():
    p = DepthPolicy(max_depth=6, step_seconds=_costs(), prior=0.8)
    long_depth = p.choose([50_000] * 32)   # KV read dominates: a draft step is ~6% of a plain one
    assert long_depth >= 3
    p = DepthPolicy(max_depth=6, step_seconds=_costs(), prior=0.8)
    assert p.choose([600] * 32) == 0       # the window is the context: a draft step costs a plain step


def test_the_depth_follows_the_measured_acceptance_and_probes_while_off():
    p = DepthPolicy(max_depth=6, step_seconds=_costs(), prior=0.8, probe_every=8, probe_budget=1.0)  # no cost cap
    ctx = [20_000] * 16
    assert p.choose(ctx) > 0
    for _ in range(400):                   # nothing accepted, ever
        p.observe(4, 0)
    assert p.acceptance < 0.05
    depths = [p.choose(ctx) for _ in range(32)]
    assert depths.count(0) == 28 and depths.count(1) == 4  # off, with a probe every 8th step
    for _ in range(400):                   # the text became predictable
        p.observe(4, 4)
    assert p.acceptance > 0.9 and p.choose(ctx) >= 4
    assert sum(p.chosen.values()) == 34
