"""The CPU sampler's cost per step: the plain statement of Gumbel-max (noise for every row and every
vocabulary entry in whole [N, V] tensors, what the sampler did before) against the sampler's blocked,
finite-entries-only draw, with the same keys: the draws must be identical, only the time differs.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.sampler_cost [--steps 30]

Prints, per case, the median time of one sampler call (keys, scores, draw) before and after.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.sample.sampler import Sampler
from engine.sample.sampling_params import SamplingParams
from engine.core.sequence import Request, Sequence
from pacore_kernels.gumbel_sample import gumbel_noise_ref

# (label, rows, vocab, the rows' SamplingParams): the issue's shape (a 41M model, vocab 32k, 16 rows at
# T=1), the embedded model's vocabulary, and a filtered and a half-greedy batch.
CASES = [
    ("T=1 unseeded, 16 x 32k", 16, 32_000, [dict(temperature=1.0)]),
    ("T=1 seeded, 16 x 32k", 16, 32_000, [dict(temperature=1.0, seed=1)]),
    ("T=1 unseeded, 16 x 49k", 16, 49_152, [dict(temperature=1.0)]),
    ("T=0.7 top_p=0.9, 16 x 49k", 16, 49_152, [dict(temperature=0.7, top_p=0.9)]),
    ("half greedy, 16 x 49k", 16, 49_152, [dict(temperature=1.0), dict(temperature=0)]),
]


def _seqs(rows: int, kinds: list[dict]) -> list[Sequence]:
    seqs = []
    for i in range(rows):
        req = Request(str(i), None, [1], SamplingParams(**kinds[i % len(kinds)]))
        seqs.append(Sequence(req, 0, [1], 1, stream=req.stream(0)))
    return seqs


def before(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence], keys: torch.Tensor) -> list[int]:
    """The plain statement: scores and noise for every row, whole tensors, then the greedy rows' argmax."""
    params = [s.params for s in seqs]
    drawn = gumbel_noise_ref(keys, logits.shape[1]).add_(sampler.scores(logits, params)).argmax(dim=-1)
    greedy = torch.tensor([p.greedy for p in params])
    return torch.where(greedy, logits.argmax(dim=-1), drawn).tolist()


def _median_ms(fn, steps: int) -> float:
    fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="timed calls per case (the median is printed)")
    args = p.parse_args(argv)
    sampler = Sampler(torch.device("cpu"), seed=0)
    g = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); median of {args.steps} calls")
    print(f"{'case':30s} {'before ms':>10s} {'after ms':>9s} {'speedup':>8s}  draws")
    ok = True
    for label, rows, vocab, kinds in CASES:
        logits = torch.randn(rows, vocab, generator=g) * 4
        seqs = _seqs(rows, kinds)
        keys = sampler.keys(seqs)
        same = before(sampler, logits, seqs, keys) == sampler(logits, seqs, keys=keys)
        ok &= same
        t0 = _median_ms(lambda: before(sampler, logits, seqs, sampler.keys(seqs)), args.steps)
        t1 = _median_ms(lambda: sampler(logits, seqs), args.steps)
        print(f"{label:30s} {t0:10.2f} {t1:9.2f} {t0 / t1:7.2f}x  {'identical' if same else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
