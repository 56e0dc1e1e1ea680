"""What `pacore run --record-confidence` costs a decode step: the sampler's work on R rows of logits at
PaCoRe-8B's vocabulary, without and with the top-20 logprobs of each sampled token.

Measured on this machine: the engine's Sampler (temperature 1, every row seeded, as PaCoRe samples),
then the same plus what a row that asks for logprobs adds, as ``engine.sample.sampler.record_logprobs`` does it
(``engine.sample.logprobs``: the fp32 log-softmax of its logits, the sampled token's logprob and rank, the top
20, appended to the trajectory's TokenLogprobs). The two are timed in turn, so machine
noise hits both alike; each figure is the median of ``--repeats`` steps. Modelled on an H200: the
bytes of fp32 logits that pass adds (log-softmax reads and writes them, topk and the rank count read
them once each) at the 4.0 TB/s copy bandwidth the rehearsal uses, against a ~30 ms decode step of
PaCoRe-8B at a long context (docs/rehearsal.md).

    python -m bench.logprobs_cost [--rows 32,256] [--vocab 151936] [--top 20] [--repeats 20] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from bench.profile_run import apply_threads

H200_BYTES_PER_S = 4.0e12  # engine/device_model.py's copy bandwidth
DECODE_STEP_S = 30e-3  # a PaCoRe-8B decode step on an H200 at a long context (docs/rehearsal.md)
PASSES = 4  # log-softmax reads and writes the row, topk reads it, the rank count reads it


@dataclass(slots=True)
class _Row:
    """What the Sampler reads of a sequence."""

    params: object
    stream: object
    num_generated: int = 0


def measure(rows: int, vocab: int, top: int, repeats: int) -> dict:
    import torch

    from engine.sample.logprobs import TokenLogprobs, compute_logprobs, raw_logprobs
    from engine.sample.rng import mix64
    from engine.sample.sampler import Sampler
    from engine.sample.sampling_params import SamplingParams

    sampler = Sampler(torch.device("cpu"))
    params = SamplingParams(temperature=1.0, seed=0)
    seqs = [_Row(params, mix64(mix64(7) + i)) for i in range(rows)]  # as Request.stream draws them
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3

    def plain():
        return sampler(logits, seqs)

    stores = [TokenLogprobs(top) for _ in range(rows)]

    def with_logprobs():
        sampled = sampler(logits, seqs)
        computed = compute_logprobs(raw_logprobs(logits), torch.tensor(sampled), top)
        for j, store in enumerate(stores):
            store.append_row(computed, j)

    times = {"plain": [], "logprobs": []}
    for _ in range(repeats + 1):  # the first of each warms up
        for name, fn in (("plain", plain), ("logprobs", with_logprobs)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    plain_s, lp_s = (statistics.median(times[n][1:]) for n in ("plain", "logprobs"))
    h200_s = PASSES * rows * vocab * 4 / H200_BYTES_PER_S
    return {"rows": rows, "plain_ms": 1e3 * plain_s, "logprobs_ms": 1e3 * lp_s, "ratio": lp_s / plain_s,
            "h200_extra_ms": 1e3 * h200_s, "h200_share": h200_s / DECODE_STEP_S}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="32,256", help="comma-separated batch sizes (default 32,256)")
    ap.add_argument("--vocab", type=int, default=151_936, help="vocabulary (default 151936, PaCoRe-8B's)")
    ap.add_argument("--top", type=int, default=20, help="top logprobs per row (default 20, DeepConf's)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    apply_threads(args.threads)
    for rows in (int(r) for r in args.rows.split(",")):
        r = measure(rows, args.vocab, args.top, args.repeats)
        print(f"rows {r['rows']:4}  sampler {r['plain_ms']:8.2f} ms  + logprobs(top {args.top}) "
              f"{r['logprobs_ms']:8.2f} ms  ratio {r['ratio']:.2f}x  | modelled H200: +{r['h200_extra_ms']:.3f} ms "
              f"= {100 * r['h200_share']:.2f}% of a {1e3 * DECODE_STEP_S:.0f} ms decode step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
