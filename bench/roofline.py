"""Roofline: how far each engine step is from the least time the machine allows.

A decode step must at least read every weight once, every *distinct* KV token its rows attend to
once (a group's shared prefix once, each trajectory's own suffix once) and write the new tokens'
KV. A prefill step must at least do its matmul and causal-attention FLOPs. The floor of a step is
max(bytes / bandwidth, FLOPs / matmul rate), with bandwidth and matmul rate measured here (a large
copy, a large matmul). `fraction = floor / achieved`: 1.0 is the roofline.

    python -m bench.roofline [--quick] [--model DIR] [--timeline timeline.jsonl]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

from engine.core.step_shape import ModelShape, StepShape


def floor_bytes(m: ModelShape, s: StepShape) -> int:
    kv = s.kv_tokens_unique + s.prefill_ctx_read + s.new_tokens  # reads + the new tokens' KV writes
    return m.weight_bytes + m.kv_bytes_per_token * kv


def floor_flops(m: ModelShape, s: StepShape) -> int:
    linear = 2 * m.num_layers * m.layer_linear_params * s.new_tokens
    head = 2 * m.vocab_size * m.hidden_size * s.num_sampled
    return linear + head + m.attn_flops_per_pair * (s.kv_tokens_logical + s.prefill_attn_pairs)


def floor_seconds(m: ModelShape, s: StepShape, bandwidth: float, flops_rate: float) -> float:
    return max(floor_bytes(m, s) / bandwidth, floor_flops(m, s) / flops_rate)


@dataclass(slots=True)
class Machine:
    bandwidth: float   # bytes/s, large device-to-device copy (read + write counted)
    flops: float       # FLOP/s, large square matmul in the run dtype
    device: str
    dtype: str


def measure_machine(device: str = "cpu", dtype: str = "float32", repeats: int = 5) -> Machine:
    import torch
    dt = getattr(torch, dtype)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def best(fn) -> float:
        fn()
        sync()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return min(times)
    nbytes = (1 << 30) if cuda else (256 << 20)  # far beyond any cache level
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    bw = 2 * nbytes / best(lambda: y.copy_(x))
    n = 8192 if cuda else 1536
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    fl = 2 * n ** 3 / best(lambda: a @ b)
    return Machine(bw, fl, device, dtype)


def analyze(records: list[dict], m: ModelShape, mach: Machine) -> list[dict]:
    """Per decode batch size and per prefill token bucket: achieved vs floor (medians)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if "new_tokens" not in r or r.get("traced"):
            continue  # no batch shape, or timed under the profiler
        key = ("decode", r["num_decode_seqs"]) if r["kind"] == "decode" else \
            ("prefill", 1 << max(0, r["num_tokens"] - 1).bit_length())
        groups.setdefault(key, []).append(r)
    rows = []
    for (kind, size), rs in sorted(groups.items()):
        shapes = [StepShape(**{k: r[k] for k in StepShape.__slots__}) for r in rs]
        floor = statistics.median(floor_seconds(m, s, mach.bandwidth, mach.flops) for s in shapes)
        model_s = statistics.median(r["model_s"] for r in rs)
        step_s = statistics.median(r["schedule_s"] + r["model_s"] + r["sample_s"] for r in rs)
        rows.append(dict(
            kind=kind, size=size, steps=len(rs), floor_ms=floor * 1e3, model_ms=model_s * 1e3,
            step_ms=step_s * 1e3, model_fraction=floor / model_s if model_s else 0.0,
            step_fraction=floor / step_s if step_s else 0.0,
            floor_mb=statistics.median(floor_bytes(m, s) for s in shapes) / 1e6,
            floor_gflop=statistics.median(floor_flops(m, s) for s in shapes) / 1e9,
            kv_read_logical_over_unique=statistics.median(
                s.kv_tokens_logical / s.kv_tokens_unique for s in shapes) if kind == "decode" else None))
    return rows


def format_table(rows: list[dict], mach: Machine) -> str:
    head = (f"machine: {mach.bandwidth / 1e9:.1f} GB/s copy, {mach.flops / 1e9:.1f} GFLOP/s matmul "
            f"({mach.device}, {mach.dtype})\n"
            f"{'kind':8}{'size':>6}{'steps':>6}{'floor MB':>10}{'GFLOP':>8}{'floor ms':>10}{'model ms':>10}"
            f"{'step ms':>9}{'model/roof':>11}{'step/roof':>10}{'KV log/uniq':>12}")
    lines = [head]
    for r in rows:
        kv = f"{r['kv_read_logical_over_unique']:.2f}" if r["kv_read_logical_over_unique"] else "-"
        lines.append(f"{r['kind']:8}{r['size']:>6}{r['steps']:>6}{r['floor_mb']:>10.1f}{r['floor_gflop']:>8.2f}"
                     f"{r['floor_ms']:>10.2f}{r['model_ms']:>10.2f}{r['step_ms']:>9.2f}"
                     f"{r['model_fraction']:>11.1%}{r['step_fraction']:>10.1%}{kv:>12}")
    lines.append("size: decode = sequences per step, prefill = tokens per step (power-of-2 bucket). "
                 "model/roof = floor / model time; step/roof = floor / whole step (scheduler + sampling too). "
                 "KV log/uniq = KV a non-sharing kernel reads / distinct KV.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--timeline", default=None, help="analyse a timeline.jsonl from bench.profile_run instead of running")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--k", type=int, default=8, help="trajectories per problem")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="2 problems, K=4, 256-token prompts, 16 tokens")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.problems, args.k, args.prompt_len, args.gen_len = 2, 4, 256, 16
    from bench.profile_run import apply_threads, run_profiled
    apply_threads(args.threads)
    import torch
    from engine import LLM
    if args.timeline:
        meta, records = read_timeline(args.timeline)
        m, device, dtype = ModelShape(**meta["model_shape"]), meta["device"], meta["dtype"]
    else:
        llm = LLM(args.model, dtype=args.dtype)
        records = run_profiled(llm, args.problems, args.k, args.prompt_len, args.gen_len, trace_steps=0)
        elem = torch.empty((), dtype=llm.dtype).element_size()
        m = ModelShape.from_config(llm.config, elem, llm.runner.kv_dtype.itemsize)  # FP8 KV: 1 byte a value
        device, dtype = llm.device.type, str(llm.dtype).split(".")[-1]
    mach = measure_machine(device, dtype)
    rows = analyze(records, m, mach)
    print(format_table(rows, mach))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(machine=asdict(mach), model_shape=asdict(m), rows=rows), f, indent=1)
    return 0


def read_timeline(path: str) -> tuple[dict, list[dict]]:
    """A timeline.jsonl: first line is the run's metadata, then one record per step."""
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return lines[0]["meta"], lines[1:]


if __name__ == "__main__":
    raise SystemExit(main())
