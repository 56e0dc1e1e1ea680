"""Self-drafting's depth policy against plain decoding, on the rehearsal's device model (no model runs).

    python -m bench.spec_policy                  # the table: batches 1..256 x contexts 1k..128k x acceptance
    python -m bench.spec_policy --kv fp8 --device FILE

For each batch of ``batch`` rows at ``context`` tokens and a true per-token acceptance ``a``, the real
DepthPolicy (engine/spec/policy.py, costs from device_model.speculation_seconds at PaCoRe-8B's shape)
chooses every step's depth and observes each verified row's accepted drafts (drawn geometrically
from ``a``); the modelled seconds of the steps it chose (draft steps, verify passes, plain steps and
its probes while off) against those of plain decoding, per token, after a warm-up from its prior.
"""
from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from dataclasses import dataclass

from engine.device_model import DeviceParams, DraftRead, speculation_seconds
from engine.spec.policy import DepthPolicy, tokens_per_verify
from engine.core.step_shape import ModelShape

BATCHES = (1, 4, 16, 64, 256)
CONTEXTS = (1_000, 4_000, 16_000, 64_000, 128_000)
ACCEPTANCES = (0.0, 0.3, 0.8)
# Qwen3-8B (PaCoRe-8B): 36 layers, 4096 hidden, 12288 MLP, 32 query / 8 KV heads of 128, 151,936 tokens
PACORE_8B = dict(num_layers=36, hidden_size=4096, intermediate_size=12288, num_heads=32, num_kv_heads=8, head_dim=128,
                 vocab_size=151936, dtype_bytes=2, qk_norm=True)


@dataclass(slots=True)
class Outcome:
    """Per token, the policy's modelled seconds against plain decoding's, and the depths it chose."""

    ratio: float          # plain seconds per token / the policy's: > 1 faster, < 1 slower
    best: float           # the same for the best fixed depth at the true acceptance (the policy's target)
    depths: Counter


def simulate(seconds, batch: int, context: int, a: float, max_depth: int = 6, warmup: int = 400, steps: int = 1600,
             seed: int = 0) -> Outcome:
    policy, rng = DepthPolicy(max_depth, seconds), random.Random(seed)
    ctx = [context] * batch
    plain = seconds(ctx, 0)[1]
    spent = tokens = 0.0
    for step in range(warmup + steps):
        n = policy.choose(ctx)
        if n == 0:
            cost, made = plain, batch
        else:
            draft_s, verify_s = seconds(ctx, n)
            cost, made = n * draft_s + verify_s, 0
            for _ in range(batch):
                m = 0
                while m < n and rng.random() < a:
                    m += 1
                policy.observe(n, m)
                made += m + 1
        if step == warmup:
            policy.chosen.clear()
        if step >= warmup:
            spent, tokens = spent + cost, tokens + made
    best = max([batch / plain] + [batch * tokens_per_verify(a, n) / (n * seconds(ctx, n)[0] + seconds(ctx, n)[1])
                                  for n in range(1, max_depth + 1)])
    return Outcome(tokens / spent / (batch / plain), best / (batch / plain), Counter(policy.chosen))


def sweep(kv_bytes: int = 2, device: str = "h200", window: int = 512, sink: int = 16, batches=BATCHES,
          contexts=CONTEXTS, acceptances=ACCEPTANCES, **kw) -> dict[tuple[int, int, float], Outcome]:
    shape = ModelShape(**PACORE_8B, kv_dtype_bytes=kv_bytes)
    seconds = speculation_seconds(shape, DeviceParams.named(device), DraftRead(window, sink))
    return {(b, c, a): simulate(seconds, b, c, a, **kw) for b in batches for c in contexts for a in acceptances}


def table(results: dict[tuple[int, int, float], Outcome]) -> str:
    lines = ["| batch | context | acceptance | policy vs plain (tok/s) | best fixed depth vs plain | depths chosen (steps) |",
             "|---|---|---|---|---|---|"]
    for (b, c, a), o in results.items():
        depths = ", ".join(f"{d}: {n}" for d, n in sorted(o.depths.items()))
        lines.append(f"| {b} | {c:,} | {a} | {o.ratio:.3f}x | {o.best:.3f}x | {depths} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spec_policy", description=__doc__.split("\n\n")[0])
    p.add_argument("--kv", choices=("bf16", "fp8"), default="bf16", help="the KV cache's format")
    p.add_argument("--device", default="h200", help="'h200' or a parameters JSON a GPU run of bench/ wrote")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--sink", type=int, default=16)
    p.add_argument("--steps", type=int, default=1600)
    args = p.parse_args(argv)
    results = sweep(1 if args.kv == "fp8" else 2, args.device, args.window, args.sink, steps=args.steps)
    print(table(results))
    worst = min(results.items(), key=lambda kv: kv[1].ratio)
    print(f"slowest against plain: {worst[1].ratio:.4f}x at batch {worst[0][0]}, context {worst[0][1]:,}, "
          f"acceptance {worst[0][2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
