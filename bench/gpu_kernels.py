"""Decode-attention benchmark: paged decode vs cascade decode vs a torch SDPA baseline.

A PaCoRe-like batch: one prompt of P tokens forked into K trajectories that have each generated
`--suffix` tokens. Times are medians (triton.testing.do_bench on CUDA). Bandwidth is reported as a
fraction of the measured device-to-device copy bandwidth, for the bytes each method must read:

- paged:   every row reads its whole sequence (prefix re-read K times)
- cascade: the prefix once per member tile + each row's suffix (the unique bytes when one tile holds the group)
- sdpa:    torch SDPA on K/V already gathered into dense [K, Hkv, L, D] tensors (gather not timed: a
           best case for torch), reads K full sequences like paged.

Each case runs for every --kv-dtypes format: auto (the cache in --dtype) and fp8_e4m3 / fp8_e5m2 (one
byte per value, upcast in registers), so bytes/s and times compare the formats (SDPA reads the FP8
cache dequantized to --dtype).

    python -m bench.gpu_kernels [--out DIR] [--dtype bfloat16]
    python -m bench.gpu_kernels --dry-run      # tiny shapes on CPU under the Triton interpreter
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for the full numbers")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prefix-lens", default="1024,4096,16384,32768")
    ap.add_argument("--ks", default="8,16,32,64")
    ap.add_argument("--suffix", type=int, default=128, help="tokens each trajectory generated so far")
    ap.add_argument("--heads", default="32,8,128", help="Hq,Hkv,head_dim (default: Llama-3-8B-like)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-dtypes", default="auto,fp8_e4m3", help="KV cache formats to run each case in")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton / kernels are imported
        args.dtype, args.prefix_lens, args.ks, args.suffix, args.heads = "float32", "32", "2,3", 5, "4,2,64"
    import torch

    import kernels

    dev = "cpu" if args.dry_run else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    Hq, Hkv, D = (int(x) for x in args.heads.split(","))
    bs = args.block_size
    elem = torch.empty((), dtype=dtype).element_size()

    if dev == "cuda":
        from triton.testing import do_bench

        def bench(fn):
            return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3  # seconds
    else:
        def bench(fn):
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

    # Device-to-device copy bandwidth (read + write), the roofline the kernels are compared to.
    n = (1 << 30) if dev == "cuda" else (1 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_bw = 2 * n / bench(lambda: dst.copy_(src))
    del src, dst
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)"
    print(f"device: {name}; copy bandwidth {copy_bw / 1e9:.1f} GB/s; {args.dtype}, Hq={Hq} Hkv={Hkv} D={D} bs={bs}")

    rows = []
    from engine.kv_cache import resolve_kv_dtype
    for P in (int(x) for x in args.prefix_lens.split(",")):
        P = -(-P // bs) * bs  # the shared prefix is whole blocks
        for K, fmt in ((int(k), f) for k in args.ks.split(",") for f in args.kv_dtypes.split(",")):
            kv_dtype = resolve_kv_dtype(fmt, dtype)
            rows.append(run_case(torch, kernels, dev, dtype, P, K, args.suffix, Hq, Hkv, D, bs, kv_dtype.itemsize,
                                 bench, copy_bw, kv_dtype))
            r = rows[-1]
            r["kv_dtype"] = fmt
            print(f"P={P:6d} K={K:3d} {fmt:>8}  paged {r['paged_us']:9.1f} us  cascade {r['cascade_us']:9.1f} us  "
                  f"sdpa {r['sdpa_us']:9.1f} us  max|cascade-paged| {r['max_diff']:.2e}", flush=True)

    table = format_table(rows)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_kernels.json"), "w") as f:
            json.dump({"device": name, "copy_bw_GBps": copy_bw / 1e9, "dtype": args.dtype,
                       "heads": [Hq, Hkv, D], "block_size": bs, "suffix": args.suffix, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "gpu_kernels_table.txt"), "w") as f:
            f.write(table + "\n")
    print(table)
    return 0


def run_case(torch, kernels, dev, dtype, P, K, suffix, Hq, Hkv, D, bs, elem, bench, copy_bw, kv_dtype=None):
    """One group of K rows sharing a P-token prefix (same physical blocks), each with its own suffix;
    the cache in kv_dtype (default dtype), elem bytes per value."""
    g = torch.Generator(device="cpu").manual_seed(P * 131 + K)
    seq = P + suffix
    pblocks = P // bs
    sblocks = -(-seq // bs) - pblocks
    nblocks = 1 + pblocks + K * sblocks
    k_cache = torch.randn(nblocks, bs, Hkv, D, generator=g).to(dtype=kv_dtype or dtype, device=dev)
    v_cache = torch.randn(nblocks, bs, Hkv, D, generator=g).to(dtype=kv_dtype or dtype, device=dev)
    tables = torch.zeros(K, pblocks + sblocks, dtype=torch.int32)
    tables[:, :pblocks] = torch.arange(1, 1 + pblocks, dtype=torch.int32)
    tables[:, pblocks:] = (1 + pblocks + torch.arange(K * sblocks, dtype=torch.int32)).view(K, sblocks)
    tables = tables.to(dev)
    i32 = dict(dtype=torch.int32, device=dev)
    seq_lens = torch.full((K,), seq, **i32)
    group_starts = torch.tensor([0, K], **i32)
    prefix_lens = torch.tensor([P], **i32)
    q = torch.randn(K, Hq, D, generator=g).to(dtype=dtype, device=dev)
    sc = 1 / math.sqrt(D)

    def paged():
        return kernels.paged_decode_triton(q, k_cache, v_cache, tables, seq_lens, sc)

    def cascade():
        return kernels.cascade_decode_triton(q, k_cache, v_cache, tables, seq_lens, group_starts, prefix_lens, sc,
                                             max_group_size=K)

    # SDPA baseline on pre-gathered dense K/V, [K, Hkv, L, D] with GQA broadcast.
    kd = k_cache[tables.long()].reshape(K, -1, Hkv, D)[:, :seq].transpose(1, 2).to(dtype).contiguous()
    vd = v_cache[tables.long()].reshape(K, -1, Hkv, D)[:, :seq].transpose(1, 2).to(dtype).contiguous()
    qd = q.unsqueeze(2)  # [K, Hq, 1, D]

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, scale=sc, enable_gqa=True)

    try:
        sdpa()
    except TypeError:  # torch < 2.5 has no enable_gqa: materialise the repeated heads instead
        kd = kd.repeat_interleave(Hq // Hkv, dim=1)
        vd = vd.repeat_interleave(Hq // Hkv, dim=1)

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, scale=sc)

    max_diff = (cascade().float() - paged().float()).abs().max().item()
    t_paged, t_cascade, t_sdpa = bench(paged), bench(cascade), bench(sdpa)
    kv_token = 2 * Hkv * D * elem  # K and V bytes of one token
    bytes_paged = K * seq * kv_token
    bytes_cascade = (P + K * suffix) * kv_token
    del kd, vd
    return {
        "prefix": P, "K": K, "suffix": suffix,
        "paged_us": t_paged * 1e6, "cascade_us": t_cascade * 1e6, "sdpa_us": t_sdpa * 1e6,
        "paged_bw_frac": bytes_paged / t_paged / copy_bw,
        "cascade_bw_frac": bytes_cascade / t_cascade / copy_bw,
        "sdpa_bw_frac": bytes_paged / t_sdpa / copy_bw,
        "cascade_speedup_vs_paged": t_paged / t_cascade,
        "max_diff": max_diff,
    }


def format_table(rows) -> str:
    head = (f"{'prefix':>7} {'K':>3} {'kv':>8} | {'paged us':>9} {'bw':>5} | {'cascade us':>10} {'bw':>5} {'x paged':>7} | "
            f"{'sdpa us':>9} {'bw':>5}")
    lines = ["bw = achieved / device copy bandwidth (bytes each method must read; cascade: prefix once)", head,
             "-" * len(head)]
    for r in rows:
        lines.append(f"{r['prefix']:>7} {r['K']:>3} {r.get('kv_dtype', 'auto'):>8} | {r['paged_us']:>9.1f} {r['paged_bw_frac']:>5.2f} | "
                     f"{r['cascade_us']:>10.1f} {r['cascade_bw_frac']:>5.2f} {r['cascade_speedup_vs_paged']:>7.2f} | "
                     f"{r['sdpa_us']:>9.1f} {r['sdpa_bw_frac']:>5.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
