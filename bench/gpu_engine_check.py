"""Engine-level GPU correctness: the Triton path and CUDA-graph decode give the torch path's tokens.

    python -m bench.gpu_engine_check          # CUDA: torch eager vs triton eager vs triton + graphs
    python -m bench.gpu_engine_check --cpu    # CPU, Triton interpreter, no graphs: checks the script

Greedy decoding of forked prompts (cascade on and off) on a tiny random Qwen3. fp32 compares the
torch references with the Triton kernels; bf16 compares eager Triton with graph replay, which runs
the very same kernels and so must give identical tokens. A seeded temperature-1 run checks the
sampler on the device the same way (a seeded token depends on the logits, seed, child and position).
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from bench.gpu_e2e import TINY, write_random_model


def _tokens(model: str, device: str, dtype: str, temperature: float = 0.0, **kw) -> list[list[int]]:
    from engine import LLM, SamplingParams
    llm = LLM(model, device=device, dtype=dtype, num_kv_blocks=512, max_model_len=1024, **kw)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (37, 100, 300)]
    params = SamplingParams(n=4, temperature=temperature, max_tokens=24, ignore_eos=True, seed=5)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.token_ids for r in outs for o in r.outputs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="CPU + Triton interpreter, no CUDA graphs")
    args = ap.parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    folder = write_random_model(tempfile.mkdtemp(prefix="pacore_check_"), TINY, dtype="float32")
    checks = []  # (name, reference settings, candidate settings)
    for cascade in (True, False):
        base = dict(cascade_attention=cascade, cascade_min_shared_tokens=0)
        checks.append((f"fp32 triton{'' if args.cpu else ' + graphs'} == torch, cascade {cascade}", "float32",
                       dict(base, attention_backend="torch", enforce_eager=True),
                       dict(base, attention_backend="triton", enforce_eager=args.cpu)))
        if not args.cpu:
            checks.append((f"bf16 graphs == eager (triton), cascade {cascade}", "bfloat16",
                           dict(base, attention_backend="triton", enforce_eager=True),
                           dict(base, attention_backend="triton", enforce_eager=False)))
    sampled = dict(temperature=1.0, cascade_attention=True, cascade_min_shared_tokens=0)
    if args.cpu:
        checks.append(("fp32 seeded sampling, triton == torch", "float32",
                       dict(sampled, attention_backend="torch"), dict(sampled, attention_backend="triton")))
    else:
        checks.append(("bf16 seeded sampling, graphs == eager", "bfloat16",
                       dict(sampled, attention_backend="triton", enforce_eager=True),
                       dict(sampled, attention_backend="triton", enforce_eager=False)))
    failed = 0
    for name, dtype, ref_kw, cand_kw in checks:
        ref = _tokens(str(folder), device, dtype, **ref_kw)
        cand = _tokens(str(folder), device, dtype, **cand_kw)
        same = sum(a == b for a, b in zip(ref, cand))
        failed += same != len(ref)
        print(f"engine check  {name:48s} {'PASS' if same == len(ref) else 'FAIL'} "
              f"({same}/{len(ref)} trajectories identical)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
