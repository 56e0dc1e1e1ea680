"""Profile a synthetic PaCoRe-shaped run: P prompts forked K ways (engine/profiler.py does the recording).

    python -m bench.profile_run --out runs/prof [--problems 4 --k 8 --prompt-len 512 --gen-len 64]
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from engine.profiler import ProfileSession, format_summary


def apply_threads(n: int | None) -> None:
    """Pin intra-op threads; the env vars reach threads torch starts later (transformers' CB loop)."""
    if not n:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    import torch
    torch.set_num_threads(n)


def run_profiled(llm, problems: int, k: int, prompt_len: int, gen_len: int, out_dir=None, seed: int = 0,
                 trace_steps: int = 8) -> list[dict]:
    """P random-token prompts forked K ways, `gen_len` tokens each; returns the step records."""
    import random
    import tempfile

    from engine import SamplingParams
    rng = random.Random(seed)
    vocab = llm.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(problems)]
    llm.generate([[3, 4, 5, 6]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up, not recorded
    with ProfileSession(llm, out_dir or tempfile.mkdtemp(prefix="pacore_prof_"), trace_steps,
                        plot=out_dir is not None) as prof:
        llm.generate(prompts, SamplingParams(n=k, max_tokens=gen_len, ignore_eos=True, seed=seed), use_tqdm=False)
    return prof.records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    apply_threads(args.threads)
    from engine import LLM
    llm = LLM(args.model, dtype=args.dtype)
    run_profiled(llm, args.problems, args.k, args.prompt_len, args.gen_len, out_dir=args.out)
    print(format_summary(json.loads((Path(args.out) / "profile_summary.json").read_text())))
    print(f"timeline, traces and kv_blocks.png in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
