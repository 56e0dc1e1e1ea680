"""Rehearse PaCoRe at a real model's shape on this CPU, against a modelled GPU.

    python -m bench.rehearsal --shape qwen3-8b --device h200 --preset high --problems 8
    python -m bench.rehearsal --preset high --problems 2 --compare      # engine vs vLLM's defaults vs ablations
    python -m bench.rehearsal --problems 30 --runs 64 --pool 512 --gpus 8 --config fp8 --config vllm-fp8
                                                                        # hours for the paper's HMMT protocol
    python -m bench.rehearsal --replay results.jsonl --preset high       # a real run's lengths
    python -m bench.rehearsal --dataset-name random --random-input-len 1024 --random-output-len 128 \
        --num-prompts 1000 --device h100                                 # a plain workload, as vllm bench

Everything but the model's arithmetic is the real code: ``LLM`` with ``device_model`` set, the
scheduler and block manager at the real block count, fork, the prefix cache, preemption,
``ModelRunner.prepare``, stop checks, and the PaCoRe runner with compaction, prompts, budgets,
results and checkpoints. What it prints is a model (engine/device_model.py): its figures
are assumed unless ``--device`` names a parameters file that a GPU run wrote.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.config import positive_int, seed_int
from engine.device_model import DeviceParams, StepCost

from bench.rehearsal import plain, protocol, report
from bench.rehearsal.checks import (BLOCK_SIZE, MAX_KV_TOKENS, Refused, check_args, check_cache, positive_number,
                                    probability, replayed_problems)
from bench.rehearsal.shapes import SHAPES, model_folder
from bench.rehearsal.profiles import scripted_drafts, spec_profiles
from bench.rehearsal.workload import PaperLengths, ReplayLengths, mean_trajectory_tokens, replay_key, round_of

PRESETS = {"low": (4,), "medium": (16,), "high": (32, 4)}
SELF_WINDOW = {"method": "self_window", "num_speculative_tokens": 6, "window": 512, "sink": 16}
# Sparse self-drafting at SELF_WINDOW's read per draft step (16 + 512 tokens of KV, besides the key bounds it
# scores): a 256-token recent window and 256 tokens of the blocks in between whose key bounds score highest.
# The even split is the one bench.spec_sparse_acceptance measured best at 4-8k with this budget (docs/speculative.md).
SELF_SPARSE = SELF_WINDOW | {"window": 256, "selected": 256}
# The same split with the blocks ranked by the last verify pass's attention (issue 51): no key bounds read or kept.
SELF_VERIFY = SELF_SPARSE | {"selection": "verify"}
# Layer-skip drafting: draft steps run 27 of PaCoRe-8B's 36 layers (3/4: the first 14 and the last 13, a middle
# block skipped, as the engine keeps them), the LM head always; the verify pass runs every layer.
SELF_SKIP = SELF_WINDOW | {"draft_layers": 27}
# vLLM V1 as `vllm serve` runs it on an H100/H200 (docs/rehearsal.md cites the source of each):
# n=K as K requests sharing the prompt's full blocks through the automatic prefix cache, chunked
# prefill with a budget of 8,192 tokens, 1,024 sequences, cascade attention only over a prefix every
# sequence of the step shares (>= 256 tokens, >= 8 requests); first come, first served: a prompt takes
# as much of the step's budget as it can (long_prefill_token_threshold 0) and a request as many seats.
VLLM = {"enable_fork": False, "enable_prefix_caching": True, "max_num_batched_tokens": 8192, "max_num_seqs": 1024,
        "gpu_memory_utilization": 0.9, "cascade_scope": "batch", "cascade_min_group": 8, "cascade_min_prefix": 256,
        "cascade_min_shared_tokens": 0, "cascade_min_saved_fraction": 0.0,
        "long_prefill_token_threshold": 0, "max_num_seqs_per_request": 1024}
# vLLM's n-gram proposer: the request's own tokens (prompt and output), prompt_lookup_min = max = 5
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 5,
              "lookup_siblings": False}
# The StreamingLLM drafter of vLLM RFC #47351's public fork (platformxlab/vegas, not upstream vLLM): the model
# drafts over a sink of one block and a window of sparse_attn_ratio (default 0.05) of the context, at least 256
# tokens, 4 drafts a step at a fixed depth.
VLLM_SELF = {"method": "self_window", "num_speculative_tokens": 4, "window": 256, "window_fraction": 0.05,
             "sink": 16, "policy": "fixed"}
# name -> engine options; "engine" is this engine's default, "vllm*" vLLM's defaults (the baselines),
# "no-sharing" an ablation: no fork, no prefix cache, no cascade (K requests each prefilling the prompt).
CONFIGS = {
    "engine": {},
    "vllm": VLLM,
    "vllm-fp8": VLLM | {"kv_cache_dtype": "fp8_e4m3"},
    "vllm-fp8+ngram": VLLM | {"kv_cache_dtype": "fp8_e4m3", "speculative_config": VLLM_NGRAM},
    # vLLM's defaults with the RFC #47351 fork's self-drafting: the same algorithm as spec-self (a public fork)
    "vllm+self": VLLM | {"speculative_config": VLLM_SELF},
    "vllm-fp8+self": VLLM | {"kv_cache_dtype": "fp8_e4m3", "speculative_config": VLLM_SELF},
    "vllm-fp8+fp8w+self": VLLM | {"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8", "speculative_config": VLLM_SELF},
    "no-sharing": {"enable_fork": False, "enable_prefix_caching": False, "cascade_attention": False},
    "no-cascade": {"cascade_attention": False},
    "no-fork": {"enable_fork": False},
    "fp8": {"kv_cache_dtype": "fp8_e4m3"},  # FP8 KV: one byte per value, twice the tokens in the same memory
    # speculative decoding: drafts accepted as --spec-profile (or --spec-acceptance) says
    "spec-ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}},
    "fp8+spec-ngram": {"kv_cache_dtype": "fp8_e4m3",
                       "speculative_config": {"method": "ngram", "num_speculative_tokens": 4}},
    # self-drafting over a sink and a window of the model's own KV (MagicDec's 512-token budget), each
    # step's depth (up to 6) chosen by the depth policy against the rehearsed device
    "spec-self": {"speculative_config": SELF_WINDOW},
    "fp8+spec-self": {"kv_cache_dtype": "fp8_e4m3", "speculative_config": SELF_WINDOW},
    # FP8 weights (--quantization fp8): the projections a byte per parameter, the LM head in bf16
    "fp8w": {"quantization": "fp8"},
    "fp8+fp8w": {"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8"},
    "fp8+fp8w+spec-self": {"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8", "speculative_config": SELF_WINDOW},
    # sparse self-drafting (issue 46) beside the window ones: acceptance WindowProfile-based, see spec_profiles
    "fp8+spec-sparse": {"kv_cache_dtype": "fp8_e4m3", "speculative_config": SELF_SPARSE},
    "fp8+fp8w+spec-sparse": {"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8", "speculative_config": SELF_SPARSE},
    # verify-guided selection and layer skipping (issue 51), acceptance from their measured sections: spec_profiles
    "fp8+spec-verify": {"kv_cache_dtype": "fp8_e4m3", "speculative_config": SELF_VERIFY},
    "fp8+fp8w+spec-verify": {"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8", "speculative_config": SELF_VERIFY},
    "fp8+spec-skip": {"kv_cache_dtype": "fp8_e4m3", "speculative_config": SELF_SKIP},
    "fp8+fp8w+spec-skip": {"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8", "speculative_config": SELF_SKIP},
    # vLLM with the same FP8 weights (--quantization fp8), FP8 KV and its n-gram proposer: fp8+fp8w+spec-self's peer
    "vllm-fp8+fp8w+ngram": VLLM | {"kv_cache_dtype": "fp8_e4m3", "quantization": "fp8", "speculative_config": VLLM_NGRAM},
}


def problems_file(folder: Path, ids: list[str], prompt_tokens: int) -> Path:
    """A problem per id whose prompt is about ``prompt_tokens`` tokens (round 1's shared prompt)."""
    words = ("the sum of two primes is even when both are odd so consider each case in turn and "
             "count the ways a number can be written as such a sum").split()
    path = folder / "problems.jsonl"
    with open(path, "w") as f:
        for i, pid in enumerate(ids):
            body = " ".join(words[(i + j) % len(words)] for j in range(int(prompt_tokens * 0.9)))
            f.write(json.dumps({"id": pid, "messages": [{"role": "user", "content": f"Problem {i}. {body}"}]}) + "\n")
    return path


def sum_costs(costs) -> StepCost:
    total = StepCost()
    for c in costs:
        total.add(c)
    return total


class Failed(RuntimeError):
    """Problems failed in a rehearsal (exit 1): its figures would leave their work out."""


def rehearse(args, name: str, options: dict, out: Path, device: DeviceParams) -> dict:
    """Run PaCoRe on the rehearsed engine with ``options``; its report (Refused, Failed: no report)."""
    from engine import LLM
    from pacore.config import RunConfig
    from pacore.runner import run_pacore

    folder = model_folder(args.shape, out.parent / "model")
    engine_options = dict(tokenizer=str(folder / "tokenizer"), device_model=args.device,
                          max_num_seqs=args.max_num_seqs, record_steps=True) | options
    if args.kv_tokens:
        engine_options["num_kv_blocks"] = args.kv_tokens // BLOCK_SIZE
    if args.max_model_len:
        engine_options["max_model_len"] = args.max_model_len
    check_cache(args, SHAPES, folder, engine_options, device)
    llm = LLM(str(folder), **engine_options)
    llm.runner.account_by = round_of
    rounds = PRESETS[args.preset]
    if args.replay:
        try:
            llm.sampler.workload = ReplayLengths(args.replay, llm.tokenizer, replay_key)
        except ValueError as e:
            raise Refused(str(e)) from None
        problem_ids = replayed_problems(llm.sampler.workload, args.problems, args.preset, rounds, args.replay)
    else:
        problem_ids = [f"p{i}" for i in range(args.protocol.sample[0])]
        mean = args.mean_tokens or mean_trajectory_tokens(args.preset, rounds)
        llm.sampler.workload = PaperLengths(mean, seed=args.seed, conclusion_median=args.conclusion_tokens,
                                            context=llm.max_model_len)
    out.mkdir(parents=True, exist_ok=True)
    data = problems_file(out, problem_ids, args.prompt_tokens)
    results = out / "results.jsonl"
    for stale in out.glob("results.jsonl*"):
        if stale.is_file():
            stale.unlink()
    cfg = RunConfig(data_path=str(data), out_path=str(results), rounds=rounds, max_tokens="auto", grade=False,
                    show_progress=not args.quiet, max_problems_in_flight=args.problems_in_flight, seed=args.seed,
                    runs=args.protocol.sample[1], pool=args.protocol.sample_pool)
    if llm.speculator is not None:
        scripted_drafts(llm, spec_profiles(args, options, cfg.temperature), args.seed)
    t0 = time.perf_counter()
    summary = run_pacore(llm, cfg, print_summary=False, interrupted="bench.rehearsal: interrupted (it has no --resume: run it again to start over)")
    wall = time.perf_counter() - t0
    if summary["errors"]:  # a table of what did not happen would read as a result
        first = summary["error_samples"][0]
        raise Failed(f"{summary['errors']} of {summary['problems']} problems failed in the rehearsal of {name} "
                     f"(first: {first['request_id']}: {first['error']}); its table would be of work never done")
    runner, ledger = llm.runner, llm.runner.ledger
    log = llm.step_log
    steps = len(ledger.steps)
    host = [(r.schedule_s + s.prepare_s + r.sample_s) for r, s in zip(log, ledger.steps)]
    res = {
        "config": name, "options": {k: v for k, v in options.items()}, "device": runner.device_params.source,
        "num_blocks": llm.block_manager.num_blocks, "kv_tokens": llm.block_manager.num_blocks * llm.block_size,
        "rounds": {str(r): f for r, f in report.by_round(ledger).items()},
        "overall": report.overall(ledger),
        "preemptions": llm.scheduler.num_preemptions,
        "prefill_tokens": llm.scheduler.prefill_tokens,
        "prefix_hit_tokens": llm.scheduler.prefix_hit_tokens,
        "recompute_tokens": ledger.recompute_tokens,
        "recompute_fraction": ledger.recompute_tokens / max(1, sum(ledger.generated.values())),
        "cascade_steps": sum(s.cascade for s in ledger.steps),
        "steps": steps,
        "host_ms_per_step": 1e3 * sum(host) / max(1, steps),
        "device_ms_per_step": 1e3 * ledger.total.total / max(1, steps),
        "wall_s": wall,
        "loop_ms_per_step": 1e3 * (wall - sum(host)) / max(1, steps),
        "occupancy": [(s.start_s, s.kv_blocks_used) for s in ledger.steps[:: max(1, steps // 400)]],
        "spec": {k: v for k, v in llm.stats().items() if k.startswith("spec_")},
        "draft_parts": report.parts(sum_costs(ledger.drafts.values())),  # self-drafting's draft steps, in total
    }
    if not args.replay:
        res["protocol"] = protocol.extrapolate(args.protocol, res, device)
    (out / "report.json").write_text(json.dumps(res, indent=1))
    return res


def _spec_line(res: dict) -> str:
    sp = res["spec"]
    if not sp:
        return ""
    return (f", {sp['spec_decode_mean_tokens_per_verify']:.2f} tokens per verify step, "
            f"{100 * sp['spec_decode_acceptance_rate']:.0f}% of draft tokens accepted")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--device", default="h200", help="a preset (h100, h100-nvl, h200, b200) or a parameters JSON a GPU run of "
                   "bench/ wrote")
    p.add_argument("--preset", choices=sorted(PRESETS), default="high")
    p.add_argument("--problems", type=positive_int, default=None,
                   help="problems to rehearse (default 8; with --replay, every problem the file recorded)")
    p.add_argument("--problems-in-flight", type=positive_int, default=64)
    p.add_argument("--prompt-tokens", type=positive_int, default=512)
    p.add_argument("--replay", metavar="RESULTS", help="lengths from a results file of pacore run: its problems "
                   "(run 0, in its order), each trajectory as long as it was recorded; --preset must be the one it ran")
    p.add_argument("--mean-tokens", type=positive_number, help="mean trajectory length (default: the paper's per preset)")
    p.add_argument("--conclusion-tokens", type=positive_number, default=1500,
                   help="median conclusion length (default 1500)")
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    p.add_argument("--kv-tokens", type=positive_int, help="cache size in tokens (default: what the device's memory holds)")
    p.add_argument("--max-kv-tokens", type=positive_int, default=MAX_KV_TOKENS,
                   help=f"refuse to model a cache larger than this many tokens: its bookkeeping lives in this CPU's "
                        f"memory (default {MAX_KV_TOKENS:,})")
    p.add_argument("--max-model-len", type=positive_int, help="context (default: the shape's, 131,072 for qwen3-8b)")
    p.add_argument("--config", action="append", choices=sorted(CONFIGS),
                   help="configurations to run (default: engine; --compare: all)")
    p.add_argument("--compare", action="store_true", help="run every configuration in CONFIGS")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--spec-profile", default=str(Path(__file__).parent / "spec_profile.json"),
                   help="acceptance profile of the spec-* configs (python -m bench.spec_acceptance writes it)")
    p.add_argument("--spec-acceptance", type=probability, metavar="P",
                   help="instead: every row drafts num_speculative_tokens (self-drafting: the depth its policy "
                        "chooses), each accepted with probability P")
    p.add_argument("--spec-self-rule", choices=("coupled", "rejection", "inverse_cdf"), default="coupled",
                   help="the acceptance rule whose measured self-drafting profile the spec-self configs take (the "
                        "rehearsal verifies as 'coupled' does: only the acceptance differs; 'inverse_cdf' is a what-if: the coupling before Gumbel-max sampling)")
    p.add_argument("--spec-self-uncapped", action="store_true",
                   help="read the measured self-drafting profile as it is, its last bin (4-8k) at every longer context "
                        "(the default before issue 44; optimistic past 8k): by default it is capped by MagicDec's "
                        "published long-context acceptance and follows it past the measured contexts")
    # the protocol (bench/rehearsal/protocol.py): pacore run's --runs / --pool / --data-parallel, and its sample
    p.add_argument("--runs", type=positive_int, default=1, help="independent runs of each problem (pacore run --runs)")
    p.add_argument("--pool", type=positive_int, help="round-1 trajectories sampled once per problem, each run drawing "
                   "its K from them (pacore run --pool)")
    p.add_argument("--gpus", type=positive_int, default=1, help="data-parallel replicas splitting the problems "
                   "(pacore run --data-parallel); the hours are the slowest replica's")
    p.add_argument("--sample-problems", type=positive_int, help="problems of the slowest replica rehearsed "
                   "(default: all of them, or 2 when --sample-runs is below --runs); the rest extrapolated")
    p.add_argument("--sample-runs", type=positive_int, help="runs of each rehearsed problem (default min(--runs, 8)), "
                   "the pool scaled alike (at least twice round 1's K); each round extrapolated to --runs")
    p.add_argument("--out", default="runs/rehearsal")
    p.add_argument("--quiet", action="store_true")
    plain.add_arguments(p)
    args = p.parse_args(argv)
    if args.dataset_name:
        return main_plain(p, args)
    names = list(CONFIGS) if args.compare else (args.config or ["engine"])
    out = Path(args.out)
    results = {}
    try:
        device = check_args(args, SHAPES, args.mean_tokens or mean_trajectory_tokens(args.preset, PRESETS[args.preset]))
        args.protocol = protocol.protocol_of(args, PRESETS[args.preset])
        from pacore.config import RunConfig
        for name in names:  # a speculative configuration's profile, read before anything runs
            spec_profiles(args, CONFIGS[name], RunConfig.__dataclass_fields__["temperature"].default)
        for name in names:
            print(f"rehearsing {name} ...", file=sys.stderr)
            results[name] = rehearse(args, name, CONFIGS[name], out / name, device)
    except (Refused, Failed) as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2 if isinstance(e, Refused) else 1
    table = report.markdown_table(results)
    if not args.replay:
        table += "\n\n" + protocol.table(args.protocol, results)
    host = "\n".join(f"{n}: host {r['host_ms_per_step']:.2f} ms/step (engine), loop {r['loop_ms_per_step']:.2f} "
                     f"ms/step (PaCoRe + rehearsal), modelled device {r['device_ms_per_step']:.2f} ms/step, "
                     f"{r['steps']} steps, {r['wall_s']:.0f} s wall" + _spec_line(r) for n, r in results.items())
    (out / "table.md").write_text(table + "\n\n" + host + "\n")
    report.plot(results, str(out / "rehearsal.png"))
    print(table)
    print(host)
    print(f"written: {out / 'table.md'}, {out / 'rehearsal.png'}, {out}/*/report.json")
    return 0


def main_plain(p: argparse.ArgumentParser, args) -> int:
    """A plain workload (--dataset-name): vllm bench's figures on the rehearsed device, for each --config
    (its engine options under the benchmark's flags; without one, this engine's defaults)."""
    try:
        device = DeviceParams.named(args.device)
    except ValueError as e:
        print(f"{p.prog}: --device: {e}", file=sys.stderr)
        return 2
    names = list(CONFIGS) if args.compare else (args.config or [""])
    try:
        for name in names:
            options = CONFIGS.get(name, {})
            if args.self_draft and "speculative_config" in options:
                raise Refused(f"--self-draft and --config {name} both name a drafter; give one of them")
            profiles = spec_profiles(args, options, 1.0)  # PaCoRe's temperature, as the PaCoRe rehearsal reads
            figures = plain.run(args, model_folder(args.shape, Path(args.out) / "model"), device, options, profiles)
            plain.print_figures(figures, device, name)
    except Refused as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
