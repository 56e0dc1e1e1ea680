"""Profile a synthetic PaCoRe-shaped run: P prompts forked K ways (engine/profiler.py does the recording).

    python -m bench.profile_run --out runs/prof [--problems 4 --k 8 --prompt-len 512 --gen-len 64]
    python -m bench.profile_run --out runs/prof --overhead   # what `pacore run --profile` costs a step

--overhead runs the workload as `pacore run --profile` records it (PaCoRe request ids, so each step's
round mix is computed; no traces) and times the session's own hooks and the files it writes at the end,
against the steps' own time.
"""
from __future__ import annotations

import argparse
import json
import os
import time
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


class _TimedSession(ProfileSession):
    """A ProfileSession that times its own hooks and its write(): what `--profile` adds to a run."""

    hook_s = write_s = 0.0

    def step_started(self) -> None:
        t = time.perf_counter()
        super().step_started()
        self.hook_s += time.perf_counter() - t

    def step_planned(self, plan) -> None:
        t = time.perf_counter()
        super().step_planned(plan)
        self.hook_s += time.perf_counter() - t

    def step_finished(self, record) -> None:
        t = time.perf_counter()
        super().step_finished(record)
        self.hook_s += time.perf_counter() - t

    def write(self) -> dict:
        t = time.perf_counter()
        out = super().write()
        self.write_s = time.perf_counter() - t
        return out


def profile_overhead(llm, problems: int, k: int, prompt_len: int, gen_len: int, out_dir, seed: int = 0) -> dict:
    """Run P prompts forked K ways as PaCoRe's round 1 (ids KEY#r1) under a timed session without traces;
    the session's hook time against the steps' time, and the seconds it took to write its files."""
    import random

    from engine import SamplingParams
    rng = random.Random(seed)
    vocab = llm.config.vocab_size
    llm.generate([[3, 4, 5, 6]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up, not recorded
    with _TimedSession(llm, out_dir, trace_steps=0) as session:
        for i in range(problems):
            prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
            llm.add_request(prompt, SamplingParams(n=k, max_tokens=gen_len, ignore_eos=True, seed=seed),
                            request_id=f"p{i}#r1")
        while llm.has_unfinished():
            llm.step()
    steps_s = sum(r["schedule_s"] + r["model_s"] + r["sample_s"] for r in session.records)
    return dict(steps=len(session.records), steps_s=steps_s, hook_s=session.hook_s,
                hook_us_per_step=1e6 * session.hook_s / max(1, len(session.records)),
                hook_share=session.hook_s / steps_s if steps_s else None, write_s=session.write_s)


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
    ap.add_argument("--overhead", action="store_true", help="time what `pacore run --profile` adds to each step "
                    "(no traces) instead of profiling with traces")
    args = ap.parse_args(argv)
    apply_threads(args.threads)
    from engine import LLM
    llm = LLM(args.model, dtype=args.dtype)
    if args.overhead:
        o = profile_overhead(llm, args.problems, args.k, args.prompt_len, args.gen_len, args.out)
        print(f"--profile without traces: {o['steps']} steps, {o['steps_s']:.2f} s in the steps; the session's hooks "
              f"{o['hook_s'] * 1e3:.1f} ms ({o['hook_us_per_step']:.0f} us per step, {100 * o['hook_share']:.2f}% "
              f"of the steps' time); writing its files at the end {o['write_s']:.2f} s")
        return 0
    run_profiled(llm, args.problems, args.k, args.prompt_len, args.gen_len, out_dir=args.out)
    print(format_summary(json.loads((Path(args.out) / "profile_summary.json").read_text())))
    print(f"timeline, traces and kv_blocks.png in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
