"""Engine-level GPU correctness: the Triton path and CUDA-graph decode against the torch path, on a tiny model.

    python3 -m bench.gpu.engine_check          # CUDA: torch eager vs triton eager vs triton + graphs
    python3 -m bench.gpu.engine_check --cpu    # CPU, Triton interpreter, graphs emulated: checks the script

FP8 weights (``fp8_weights``, run by the GPU plan's fp8 stage through bench/gpu/fp8_gemm.py --engine):
the model quantized at load (quantization="fp8": per-channel scales, torch._scaled_mm on sm_89+) with its
decode graphs, greedy, against the same model in bf16 with graphs; the agreement is the one documented
for FP8 weights on tiny random models (tests/engine/test_fp8_weights.py LOGIT_BOUND: every step's logits
within 25% of the step's largest, flips only where the logits explain them).

Forked prompts on a tiny random Qwen3 (cascade on and off), greedy and seeded temperature-1. fp32
compares the torch references with the Triton kernels (+ graphs); bf16 compares eager Triton with
graph replay.

How runs are compared (the kernels are NOT planned identically: a graph replays a batch padded to its
bucket, so its split counts and tile heights may differ from an eager call's, and bf16 sums in another
order may differ by an ulp): every step's logits must agree within a tolerance (relative to the step's
largest logit), and the tokens must be the same except where a flip is explained by those logits.
A greedy flip is explained when the reference's top-2 margin is within twice the step's largest
logit difference (a clear margin cannot flip); a seeded draw's flip when the logits differ at all
(equal logits and seed must draw equal tokens). A trajectory is compared up to and including its
first flip (after it the contexts differ).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

from bench.gpu.checkpoint import TINY, write_random_model
from bench.gpu.logits import TOL, recorded_logits


def _run(model: str, device: str, dtype: str, temperature: float = 0.0, graphs: bool = False, prompts=(37, 100, 300),
         n: int = 4, max_tokens: int = 24, **kw) -> dict:
    """{(request id, child): (tokens, [logits row per token])}. graphs on CPU: emulated (static buffers,
    eager calls)."""
    from engine import LLM, SamplingParams
    cuda_graphs = graphs and device == "cuda"
    with LLM(model, device=device, dtype=dtype, num_kv_blocks=512, max_model_len=1024, max_num_seqs=16,
             enforce_eager=not cuda_graphs, **kw) as llm:
        if graphs and not cuda_graphs:
            llm.runner.capture_decode_graphs(16, emulate=True)
        g = torch.Generator().manual_seed(0)
        ids = [torch.randint(3, 500, (n,), generator=g).tolist() for n in prompts]
        params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=5)
        with recorded_logits(llm) as rows:
            outs = llm.generate(ids, params, use_tqdm=False)
    return {(r.request_id, o.index): (o.token_ids, rows[r.request_id, o.index]) for r in outs for o in r.outputs}


FP8_WEIGHTS_TOL = 0.25  # tests/engine/test_fp8_weights.py LOGIT_BOUND: FP8 weights vs the model's dtype, tiny models


def fp8_weights(cpu: bool, tiny: bool) -> dict:
    """The FP8-weight case (module docstring): compare()'s result with its name, dtype and tolerance. On a
    CPU: fp32 (the FP8 reference path), graphs emulated."""
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    device, dtype = ("cpu", "float32") if cpu else ("cuda", "bfloat16")
    folder = write_random_model(tempfile.mkdtemp(prefix="pacore_fp8w_"), TINY, dtype="float32")
    size = dict(prompts=(5, 20), n=2, max_tokens=5) if tiny else dict(prompts=(37, 100), n=4, max_tokens=16)
    base = dict(cascade_attention=True, cascade_min_shared_tokens=0, attention_backend="triton", graphs=True)
    ref = _run(str(folder), device, dtype, **size, **base)
    cand = _run(str(folder), device, dtype, **size, **base, quantization="fp8")
    r = compare(ref, cand, FP8_WEIGHTS_TOL, greedy=True)
    return dict(r, name=f"{'fp32' if cpu else 'bf16'} fp8 weights + graphs vs {dtype} + graphs", dtype=dtype,
                tol=FP8_WEIGHTS_TOL)


def compare(ref: dict, cand: dict, tol: float, greedy: bool) -> dict:
    """The check of the module docstring: counts of identical and explained trajectories, the largest
    relative logit difference, and the unexplained flips (none to pass)."""
    worst, same, explained, unexplained = 0.0, 0, 0, []
    for key, (tokens, rows) in ref.items():
        c_tokens, c_rows = cand[key]
        for i, (a, b) in enumerate(zip(rows, c_rows)):
            diff = float((a - b).abs().max())
            worst = max(worst, diff / max(float(a.abs().max()), 1e-6))
            if tokens[i] != c_tokens[i]:
                top2 = a.topk(2).values
                ok = float(top2[0] - top2[1]) <= 2 * diff if greedy else diff > 0
                explained += ok
                if not ok:
                    unexplained.append(f"{key} step {i}: {tokens[i]} vs {c_tokens[i]}")
                break
        else:
            same += tokens == c_tokens
    return dict(trajectories=len(ref), identical=same, explained_flips=explained, unexplained=unexplained,
                max_rel_logit_diff=worst, passed=not unexplained and worst <= tol)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="CPU + Triton interpreter, CUDA graphs emulated")
    ap.add_argument("--tiny", action="store_true", help="fewer, shorter trajectories (the CPU dry run)")
    args = ap.parse_args(argv)
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported (the first LLM does)
    device = "cpu" if args.cpu else "cuda"
    folder = write_random_model(tempfile.mkdtemp(prefix="pacore_check_"), TINY, dtype="float32")
    size = dict(prompts=(5, 20), n=2, max_tokens=5) if args.tiny else {}
    checks = []  # (name, dtype, temperature, reference settings, candidate settings)
    for cascade in (True, False):
        base = dict(cascade_attention=cascade, cascade_min_shared_tokens=0)
        checks.append((f"fp32 triton + graphs == torch, cascade {cascade}", "float32", 0.0,
                       dict(base, attention_backend="torch"), dict(base, attention_backend="triton", graphs=True)))
        if not args.cpu:
            checks.append((f"bf16 graphs == eager (triton), cascade {cascade}", "bfloat16", 0.0,
                           dict(base, attention_backend="triton"), dict(base, attention_backend="triton", graphs=True)))
    # Speculative decoding (greedy, cascade on): verify steps and self-drafting's draft steps from their
    # graphs against the torch path without speculation; positions past a run's end are sampled again,
    # so the recorded row of a token is the one it was drawn from.
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
    window = {"method": "self_window", "num_speculative_tokens": 3, "window": 16, "sink": 4, "policy": "fixed"}
    base = dict(cascade_attention=True, cascade_min_shared_tokens=0)
    for label, spec in (("ngram", ngram), ("self_window", window)):
        checks.append((f"fp32 triton + graphs + {label} == torch", "float32", 0.0, dict(base, attention_backend="torch"),
                       dict(base, attention_backend="triton", graphs=True, speculative_config=spec)))
    sampled = dict(cascade_attention=True, cascade_min_shared_tokens=0, attention_backend="triton")
    if args.cpu:
        checks.append(("fp32 seeded sampling, triton + graphs == torch", "float32", 1.0,
                       dict(sampled, attention_backend="torch"), dict(sampled, graphs=True)))
    else:
        checks.append(("bf16 seeded sampling, graphs == eager", "bfloat16", 1.0, sampled, dict(sampled, graphs=True)))
    failed = 0
    for name, dtype, temperature, ref_kw, cand_kw in checks:
        try:
            ref = _run(str(folder), device, dtype, temperature, **size, **ref_kw)
            cand = _run(str(folder), device, dtype, temperature, **size, **cand_kw)
        except Exception as e:  # one failing check (a capture, a kernel) must not cost the others
            failed += 1
            print(f"engine check  {name:48s} FAIL ({type(e).__name__}: {str(e)[:500]})", flush=True)
            continue
        r = compare(ref, cand, TOL[dtype], greedy=temperature == 0)
        failed += not r["passed"]
        print(f"engine check  {name:48s} {'PASS' if r['passed'] else 'FAIL'} ({r['identical']}/{r['trajectories']} "
              f"identical, {r['explained_flips']} flips explained by the logits, max logit diff "
              f"{r['max_rel_logit_diff']:.1e} of the largest, tolerance {TOL[dtype]:.0e})"
              + "".join(f"\n    unexplained: {u}" for u in r["unexplained"]), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
