"""When to speculate, and how far: each step's draft depth (0 = a plain decode step), chosen from the
acceptance measured online and the modelled cost of the step's passes at its real context lengths.

With per-token acceptance a, a row carrying n drafts emits (1 - a^(n+1)) / (1 - a) tokens per verify
(geometric acceptance, MagicDec's model) for n draft steps and one verify pass of n + 1 queries. The
policy takes the n that maximises tokens per second, against one token per plain step. Long contexts
favour deep drafts (a draft step reads a window, a verify or plain step every token of KV), short
contexts and compute-bound batches none: there the policy turns speculation off by itself. While it is
off it still drafts one token now and then, so the acceptance it relies on stays measured: every
``probe_every`` steps, or more rarely, so that the probes cost at most ``probe_budget`` of the time, and
never where even drafts that are always right would not pay (the policy is then never slower than
plain decoding by more than that budget: bench/spec_policy.py, tests/bench/test_bench_spec_policy.py).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

# (the batch's context lengths, depth n) -> (seconds of one draft step, seconds of the verify pass with
# n drafts per row); n = 0: (0, a plain decode step)
StepSeconds = Callable[[list[int], int], tuple[float, float]]


def tokens_per_verify(a: float, n: int) -> float:
    """Expected tokens a row emits per verify with n drafts, each accepted with probability a (while
    the ones before it were)."""
    return float(n + 1) if a >= 1.0 else (1.0 - a ** (n + 1)) / (1.0 - a)


@dataclass(slots=True)
class DepthPolicy:
    """Chooses each step's draft depth (``choose``) and learns the acceptance (``observe``)."""

    max_depth: int
    step_seconds: StepSeconds
    prior: float = 0.6          # acceptance assumed before any is measured...
    prior_weight: float = 8.0   # ...worth this many verified drafts
    half_life: float = 512.0    # verified drafts after which an observation weighs half
    probe_every: int = 64
    probe_budget: float = 0.002  # the most of the time probes may add while speculation is off
    accepted: float = 0.0       # decayed counts: drafts accepted, drafts that were verified
    reached: float = 0.0
    steps_off: int = 0
    chosen: Counter = field(default_factory=Counter)  # depth -> steps that took it
    _cache: tuple = ()          # (key, depth, steps between probes): a choice holds while the batch barely changes

    @property
    def acceptance(self) -> float:
        return (self.accepted + self.prior * self.prior_weight) / (self.reached + self.prior_weight)

    def observe(self, drafted: int, accepted: int) -> None:
        """One verified row: ``accepted`` of its ``drafted`` drafts kept. A draft after a rejected one
        was never tested, so it counts for nothing (the estimate of a geometric rate)."""
        reached = min(accepted + 1, drafted)
        decay = 0.5 ** (reached / self.half_life)
        self.accepted = self.accepted * decay + accepted
        self.reached = self.reached * decay + reached

    def choose(self, ctx_lens: list[int]) -> int:
        a = self.acceptance
        # Contexts grow a token or a few per step: recompute when the batch or its KV changed by ~3%, or the
        # acceptance by 1/64 or ~3% of itself (a choice made at the top of a coarse bucket near 0 would hold
        # down to 0: speculating at an acceptance that no longer pays).
        key = (len(ctx_lens), round(math.log(max(1, sum(ctx_lens))) * 32), round(a * 64),
               round(math.log(max(a, 1e-9)) * 32))
        if self._cache and self._cache[0] == key:
            depth, every = self._cache[1:]
        else:
            depth = self._best(ctx_lens, a)
            every = self._probe_interval(ctx_lens) if depth == 0 else 0
            self._cache = (key, depth, every)
        if depth == 0:
            self.steps_off += 1
            if every and self.steps_off >= every:
                self.steps_off, depth = 0, 1  # keep measuring what speculation would accept
        else:
            self.steps_off = 0
        self.chosen[depth] += 1
        return depth

    def _probe_interval(self, ctx_lens: list[int]) -> int:
        """Steps between probes (0: none, drafts always right would not pay here either)."""
        if self._best(ctx_lens, 1.0) == 0:
            return 0
        plain = self.step_seconds(ctx_lens, 0)[1]
        draft_s, verify_s = self.step_seconds(ctx_lens, 1)
        return max(self.probe_every, math.ceil((draft_s + verify_s - plain) / (self.probe_budget * plain)))

    def _best(self, ctx_lens: list[int], a: float) -> int:
        best, best_rate = 0, 1.0 / self.step_seconds(ctx_lens, 0)[1]
        for n in range(1, self.max_depth + 1):
            draft_s, verify_s = self.step_seconds(ctx_lens, n)
            rate = tokens_per_verify(a, n) / (n * draft_s + verify_s)
            if rate > best_rate:
                best, best_rate = n, rate
        return best


def adaptive_policy(spec, model_config, dtype, kv_dtype, device=None, block_size: int = 16) -> DepthPolicy | None:
    """Self-drafting's adaptive depth (speculative_config policy "adaptive"), its costs from the rehearsal's
    device model of ``spec.cost_model`` (or ``device``, a DeviceParams: a rehearsal's own) at this model's
    shape and KV format, a draft step priced at what it reads (device_model.DraftRead: the drafted layers,
    window, sink, selected blocks and any key bounds); None otherwise."""
    if spec.method != "self_window" or spec.policy != "adaptive":
        return None
    from engine.device_model import DeviceParams, DraftRead, speculation_seconds
    from engine.core.step_shape import ModelShape
    shape = ModelShape.from_config(model_config, dtype.itemsize, kv_dtype.itemsize)
    device = device or DeviceParams.named(spec.cost_model)
    seconds = speculation_seconds(shape, device, DraftRead.of(spec, block_size))
    return DepthPolicy(spec.num_speculative_tokens, seconds)
