"""The FP8 linear layer (pacore_kernels/fp8_gemm.py) against bf16 at PaCoRe-8B's shapes, on one GPU.

Qwen3-8B's four projections as the engine fuses them (q|k|v 4096 -> 6144, o 4096 -> 4096, gate|up
4096 -> 24576, down 12288 -> 4096) at 1, 16, 64, 128 and 256 rows (decode batches), each with
per-channel scales (``--quantization fp8``: ``torch._scaled_mm`` on sm_89+) and with 128 x 128 block
scales (a pre-quantized checkpoint: the Triton kernel on sm_89+). Each row: the bf16 ``F.linear`` and
the FP8 layer (its per-token activation quantization included) per call in microseconds, the speedup
(bf16 / FP8), ``rel_err`` of the FP8 layer against its torch reference on the same device (the kernel's
correctness: bf16 output rounding only), ``quant_rel_err`` against the bf16 product (what FP8 costs in
accuracy), and ``pass`` (rel_err < 1e-2). Weights are cycled over copies larger than L2 together, so
each call reads its weights from memory as a decode step does. Rows go to OUT/gpu_fp8_gemm.json (a
list) as they run.

Then each path as the engine's decode graphs run it: ``fp8_linear`` (per-token activation quantization,
then ``torch._scaled_mm`` per channel or the Triton kernel for block scales) captured in a CUDA graph at
GRAPH_ROWS rows and replayed, against bf16 ``F.linear`` replayed the same way. Such a row ("graph": true)
passes when the replay equals the eager call exactly and stays within PASS_REL_ERR of the reference (a
graph bakes in one weight copy, so the smaller shapes may read it from L2: its time is the replay's).
With --engine, last: the engine itself with FP8 weights and its decode graphs against bf16
(bench/gpu/engine_check.py fp8_weights), written to OUT/gpu_engine_fp8.json.

    python3 -m bench.gpu.fp8_gemm --out DIR [--engine]
    python3 -m bench.gpu.fp8_gemm --out DIR --dry-run   # CPU: tiny shapes, the reference and the interpreter,
                                                        # graphs emulated (the calls themselves)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}  # (in, out)
TINY_SHAPES = {"qkv": (256, 384), "down": (384, 256)}
ROWS = (1, 16, 64, 128, 256)
TINY_ROWS = (1, 5)
GRAPH_ROWS, TINY_GRAPH_ROWS = (1, 64), (5,)
SCALES = {"channel": None, "block128": (128, 128)}
REPS, WARMUP = 20, 3
ROTATE_BYTES = 256 << 20  # weight copies cycled per case: several times an H100/H200's L2
PASS_REL_ERR = 1e-2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, required=os.environ.get("OUT") is None,
                    help="folder for gpu_fp8_gemm.json")
    ap.add_argument("--engine", action="store_true", help="then the engine with FP8 weights and graphs against bf16")
    ap.add_argument("--dry-run", "--tiny", dest="dry_run", action="store_true",
                    help="CPU at tiny shapes: the code path, no GPU figures (--tiny: bench/gpu/check.sh's dry run)")
    return ap.parse_args(argv)


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def timer(torch, dev: str, reps: int = REPS, warmup: int = WARMUP):
    """us per call of fn(i), i cycling over the weight copies: the mean of ``reps`` calls after ``warmup``."""
    def run(fn, copies: int) -> float:
        for i in range(warmup):
            fn(i % copies)
        if dev == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(reps):
                fn(i % copies)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e3 / reps
        t0 = time.perf_counter()
        for i in range(reps):
            fn(i % copies)
        return (time.perf_counter() - t0) * 1e6 / reps
    return run


def fp8_call(torch, x, qs: list, block, dry_run: bool):
    """(fn(i): the FP8 layer on x with weight copy i, its path's name). A dry run's block scales go through
    the Triton kernel under the interpreter with fp32 operands (its e4m3 loads are a GPU's)."""
    from pacore_kernels.fp8_gemm import fp8_block_gemm_triton, fp8_linear, gemm_path, quantize_rows_ref
    if dry_run and block is not None:
        def fp8(i):
            xq, xs = quantize_rows_ref(x, block[1])
            return fp8_block_gemm_triton(xq.float(), xs, qs[i][0].float(), qs[i][1], block, x.dtype)
        return fp8, "triton_block (interpreter)"

    def fp8(i):
        return fp8_linear(x, qs[i][0], qs[i][1], None, block)
    return fp8, gemm_path(x.device, x.dtype, block, *qs[0][0].shape)


def capture(torch, dev: str, fn):
    """fn() captured in a CUDA graph: (replay, its static output). On a CPU the call itself, into the same
    output each time (graphs emulated: the dry run checks the code path, not a capture)."""
    if dev != "cuda":
        out = fn()
        return (lambda: out.copy_(fn())), out
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compiles, cuBLAS workspaces
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def graph_rows(torch, F, dev: str, dtype, name: str, w, quantized: dict, rows: tuple, time_us, paths: dict) -> list:
    """Each scales' path replayed from a CUDA graph at each of rows (module docstring)."""
    from pacore_kernels.fp8_gemm import fp8_linear_ref
    out_rows = []
    gen = torch.Generator(device=dev).manual_seed(1)
    for m in rows:
        x = torch.randn(m, w.shape[1], device=dev, generator=gen).to(dtype)
        replay_bf16, _ = capture(torch, dev, lambda: F.linear(x, w))
        bf16_us = time_us(lambda i: replay_bf16(), 1)
        for scales, make in paths.items():
            fp8, path_name = make(x)
            q = quantized[scales][0]
            row = dict(shape=f"{name} {w.shape[1]}->{w.shape[0]}", scales=scales, M=m, path=f"{path_name} graph",
                       graph=True)
            try:
                eager = fp8(0).clone()
                replay, out = capture(torch, dev, lambda: fp8(0))
                replay()
                row.update(same_as_eager=bool(torch.equal(out, eager)),
                           rel_err=rel_err(out, fp8_linear_ref(x, *q, None, SCALES[scales])), bf16_us=bf16_us,
                           fp8_us=time_us(lambda i: replay(), 1))
                ok = row["same_as_eager"] and row["rel_err"] < PASS_REL_ERR
                row.update(speedup=bf16_us / row["fp8_us"], **{"pass": ok})
            except Exception as e:  # a capture that fails costs its row
                row.update(error=f"{type(e).__name__}: {e}"[:300], bf16_us=bf16_us, fp8_us=None, speedup=None,
                           rel_err=None, **{"pass": False})
            out_rows.append(row)
    return out_rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's kernels are created
    import torch
    import torch.nn.functional as F

    from pacore_kernels.fp8_gemm import fp8_linear_ref, quantize_weight
    dev = "cpu" if args.dry_run else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("gpu_fp8_gemm: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    shapes, rows_list = (TINY_SHAPES, TINY_ROWS) if args.dry_run else (SHAPES, ROWS)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_fp8_gemm.json"
    time_us = timer(torch, dev, *((2, 0) if args.dry_run else (REPS, WARMUP)))  # a dry run's times mean nothing
    gen = torch.Generator(device=dev).manual_seed(0)
    results = []
    for name, (k, n) in shapes.items():
        w = torch.randn(n, k, device=dev, generator=gen).mul_(0.02).to(dtype)
        copies = 1 if args.dry_run else max(1, -(-ROTATE_BYTES // (n * k * 2)))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        quantized = {s: [quantize_weight(x, block) for x in ws] for s, block in SCALES.items()}
        for m in rows_list:
            x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
            bf16_us = time_us(lambda i: F.linear(x, ws[i]), copies)
            for scales, block in SCALES.items():
                qs = quantized[scales]
                fp8, path_name = fp8_call(torch, x, qs, block, args.dry_run)
                row = dict(shape=f"{name} {k}->{n}", scales=scales, M=m, path=path_name)
                try:
                    out = fp8(0)
                    ref = fp8_linear_ref(x, *qs[0], None, block)
                    row["rel_err"] = rel_err(out, ref)
                    row["quant_rel_err"] = rel_err(out, F.linear(x.float(), w.float()))
                    row["bf16_us"] = bf16_us
                    row["fp8_us"] = time_us(fp8, copies)
                    row["speedup"] = bf16_us / row["fp8_us"]
                    row["pass"] = row["rel_err"] < PASS_REL_ERR
                except Exception as e:  # one failed case costs its row, not the run
                    row.update(error=f"{type(e).__name__}: {e}"[:300], bf16_us=bf16_us, fp8_us=None, speedup=None,
                               rel_err=None, **{"pass": False})
                results.append(row)
                path.write_text(json.dumps(results, indent=1))
                print(json.dumps(row), flush=True)
        paths = {}
        for scales, block in SCALES.items():
            paths[scales] = (lambda x, qs=quantized[scales], block=block: fp8_call(torch, x, qs, block, args.dry_run))
        for row in graph_rows(torch, F, dev, dtype, name, w, quantized,
                              TINY_GRAPH_ROWS if args.dry_run else GRAPH_ROWS, time_us, paths):
            results.append(row)
            path.write_text(json.dumps(results, indent=1))
            print(json.dumps(row), flush=True)
        del ws, quantized
        if dev == "cuda":
            torch.cuda.empty_cache()
    failed = [r for r in results if not r["pass"]]
    print(f"gpu_fp8_gemm: {len(results) - len(failed)}/{len(results)} rows pass; written {path}", file=sys.stderr)
    if args.engine:
        from bench.gpu.engine_check import fp8_weights
        try:
            check = fp8_weights(cpu=args.dry_run, tiny=args.dry_run)
        except Exception as e:  # the engine failing to load or capture is this check's FAIL
            check = dict(name="fp8 weights + graphs", passed=False, error=f"{type(e).__name__}: {e}"[:500])
        (out_dir / "gpu_engine_fp8.json").write_text(json.dumps(check, indent=1))
        print(f"engine check  {json.dumps(check)}", flush=True)
        failed += [check] if not check["passed"] else []
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
