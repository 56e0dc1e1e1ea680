"""Chaos at PaCoRe-8B's shape: ``pacore run`` itself (its flags, preflight, signals, runner, results,
checkpoints, snapshots and resume) on the rehearsed engine, stopped by SIGKILL and SIGTERM at random
moments and resumed each time, against the same run never stopped (bench/chaos.py checks what holds).

    python -m bench.rehearsal.chaos --kills 20 --preset low --problems 2 --runs 2 --pool 8 \\
        --mean-tokens 1500 --max-tokens 4096 --kv-tokens 8192

Only the engine differs from a real run: ``LLM(..., device_model=...)`` at the shape's config (no weights;
the scheduler, block manager, preemption and prefix cache at the modelled cache's size), trajectories of
seeded lengths (bench/rehearsal/workload.py), and for a speculative resume the scripted drafts of the
rehearsal. A resume picks, seeded, plain decoding, n-gram drafts or self-drafting. ``session`` runs one
session (what the chaos driver starts): ``python -m bench.rehearsal.chaos session [ENGINE FLAGS] -- [pacore run
flags]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from engine.config import positive_int

from bench.rehearsal.checks import BLOCK_SIZE, positive_number
from bench.rehearsal.shapes import SHAPES, model_folder

SPECULATIVE = [{"method": "ngram", "num_speculative_tokens": 4},
               {"method": "self_window", "num_speculative_tokens": 6, "window": 512, "sink": 16}]


def session(argv: list[str]) -> int:
    """One ``pacore run`` whose engine is the rehearsed one: the command's own code path, with its
    ``build_llm`` swapped."""
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal.chaos session")
    p.add_argument("--device", default="h200")
    p.add_argument("--mean-tokens", type=positive_number, required=True)
    p.add_argument("--conclusion-tokens", type=positive_number, default=1500)
    p.add_argument("--kv-tokens", type=positive_int)
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    opts = p.parse_args(argv[:cut])
    import pacore.cli.run as command

    def build_llm(cfg):
        from engine import LLM

        from bench.rehearsal.profiles import scripted_drafts, spec_profiles
        from bench.rehearsal.workload import PaperLengths

        options = {**cfg.engine_options, "tokenizer": str(Path(cfg.engine.model) / "tokenizer"),
                   "device_model": opts.device, "max_num_seqs": opts.max_num_seqs}
        if opts.kv_tokens:
            options["num_kv_blocks"] = opts.kv_tokens // BLOCK_SIZE
        llm = LLM(seed=cfg.seed, **options)
        print(llm.describe(), file=sys.stderr, flush=True)
        llm.sampler.workload = PaperLengths(opts.mean_tokens, seed=cfg.seed, conclusion_median=opts.conclusion_tokens,
                                            context=llm.max_model_len)
        if llm.speculator is not None:
            profile = argparse.Namespace(spec_acceptance=None, spec_self_rule="coupled",
                                         spec_profile=str(Path(__file__).parent / "spec_profile.json"))
            scripted_drafts(llm, spec_profiles(profile, options, cfg.temperature), cfg.seed)
        return llm

    command.build_llm = build_llm
    from pacore.cli import main as pacore
    return pacore(["run", *argv[cut + 1:]])


def problems(folder: Path, count: int, prompt_tokens: int) -> Path:
    from bench.rehearsal.__main__ import problems_file
    return problems_file(folder, [f"p{i}" for i in range(count)], prompt_tokens)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["session"]:
        return session(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=positive_int, default=20)
    p.add_argument("--seed", type=int, default=0, help="seeds the moments, the signals, the variants and the run")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--device", default="h200")
    p.add_argument("--preset", choices=("low", "medium", "high"), default="low")
    p.add_argument("--problems", type=positive_int, default=2)
    p.add_argument("--runs", type=positive_int, default=2)
    p.add_argument("--pool", type=positive_int)
    p.add_argument("--prompt-tokens", type=positive_int, default=512)
    p.add_argument("--mean-tokens", type=positive_number, default=1500)
    p.add_argument("--conclusion-tokens", type=positive_number, default=300)
    p.add_argument("--max-tokens", default="auto", help="each trajectory's budget (default auto: the context)")
    p.add_argument("--kv-tokens", type=positive_int, help="the modelled cache in tokens (small: preemption)")
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    p.add_argument("--checkpoint-every", type=positive_number, default=1.0)
    p.add_argument("--out", default="runs/rehearsal-chaos")
    args = p.parse_args(argv)
    from bench.chaos import run_chaos

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = model_folder(args.shape, out / "model")
    data = problems(out, args.problems, args.prompt_tokens)
    engine = ["--device", args.device, "--mean-tokens", str(args.mean_tokens), "--conclusion-tokens",
              str(args.conclusion_tokens), "--max-num-seqs", str(args.max_num_seqs)]
    if args.kv_tokens:
        engine += ["--kv-tokens", str(args.kv_tokens)]
    run = ["--model", str(folder), "--data", str(data), "--preset", args.preset, "--runs", str(args.runs),
           "--max-tokens", args.max_tokens, "--seed", str(args.seed), "--no-grade", "--no-progress",
           "--checkpoint-every", str(args.checkpoint_every), "--max-problems-in-flight", str(args.problems)]
    if args.pool:
        run += ["--pool", str(args.pool)]
    cmd = [sys.executable, "-m", "bench.rehearsal.chaos", "session", *engine, "--", *run]
    variants = [[]] + [["--speculative-config", json.dumps(spec)] for spec in SPECULATIVE]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    report = run_chaos(cmd, out / "runs", args.kills, args.seed, variants, env=env)
    print(report.summary())
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
