"""The attention kernels at PaCoRe-8B's shape (Qwen3-8B heads 32/8/128, bf16): stages of the GPU plan
(bench/gpu/check.sh runs it in parts with --only; a run keeps the rows of earlier runs into the same
--out for the cases it does not run). Past 300 lines: every kernel case of the GPU check is here.

Cases (each row is written to $OUT/gpu_kernels.json as soon as it ran, so a timeout keeps what ran):
- copy: device-to-device copy bandwidth (the roofline of decode) and a bf16 matmul's TFLOP/s;
- paged decode at B=32 x 16k and 32k, B=4 x 64k, B=1 x 131k, B=256 x 2k: time, error vs the fp32
  reference, and bytes read / time as a fraction of the copy bandwidth;
- cascade vs paged at round 2 (4 x 64k prefix + 1k) and round 1 (32 x 512 prefix + 16k), eager and
  replayed from a CUDA graph captured with the padded groups engine/worker/cuda_graphs.py passes. Cascade
  runs as the engine runs it: its prefix plan built once per step and reused by all LAYERS layers
  (work_plans); the plan's own cost per step is timed apart (plan_us), its share per layer in the
  speedups; paged and cascade run for each --kv-dtypes format (auto: bf16; fp8_e4m3 / fp8_e5m2: a byte
  a value, with per-layer scales K_SCALE / V_SCALE; the error is vs the fp32 reference on the
  dequantized cache, so it is the kernel's, not the format's);
- prefill of a 16k and a 64k prompt: Triton in 2048-token chunks over the paged cache and in one
  chunk, for every bf16 tile of pacore_kernels/prefill_attention.PREFILL_TILES, and torch SDPA (flash) on the
  prompt's own K/V: TFLOP/s and error (the fastest tile is what PREFILL_TILE should be);
- a cache whose offsets pass 2^31 elements (store, paged, cascade, prefill on its last blocks);
- one captured graph replayed with changed lengths, tables and groups.
K/V and queries are drawn on the device. $OUT/device_params.json gets the figures a device model reads
(write_device_params) after each shape. Each row's verdict: bench/gpu/common.py verdict.

    python3 -m bench.gpu.kernels [--out DIR] [--only paged,cascade,...] [--kv-dtypes auto,fp8_e4m3]
    python3 -m bench.gpu.kernels --tiny     # CPU, Triton interpreter, tiny shapes: checks the code path
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from bench.gpu.common import REL_TOL, commit, open_kernels, rel_err, run_cases, verdict, write_device_params

CASES = ("copy", "paged", "cascade", "prefill", "offsets", "replay")
K_SCALE, V_SCALE = 0.5, 0.25  # an FP8 cache's dequantization factors: not 1, so the folded scales run too
LAYERS = 36  # Qwen3-8B's: the layers of a step that share one cascade prefix plan


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", "--dry-run", dest="tiny", action="store_true",
                    help="CPU under TRITON_INTERPRET=1 at tiny shapes (no numbers, the code path)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for the json and the table")
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--kv-dtypes", default="auto,fp8_e4m3",
                    help="KV cache formats of the paged and cascade cases (auto, fp8_e4m3, fp8_e5m2)")
    return ap.parse_args(argv)


class Bench:
    """Shapes, timer, cache builders and the incremental json of one run."""

    def __init__(self, args):
        import torch
        self.torch, self.args, self.tiny = torch, args, args.tiny
        self.dev = "cpu" if args.tiny else "cuda"
        self.dtype = torch.float32 if args.tiny else torch.bfloat16
        self.Hq, self.Hkv, self.D = (4, 2, 64) if args.tiny else (32, 8, 128)
        self.bs = 16
        self.rows: list[dict] = self.earlier_rows()
        self.copy_bw = next((r["copy_bw_GBps"] * 1e9 for r in self.rows if r["case"] == "copy"), None)
        self.name = "cpu (interpreter)" if args.tiny else torch.cuda.get_device_name()
        self.gen = torch.Generator(device="cpu").manual_seed(0)  # block tables and permutations (small)
        self.dgen = torch.Generator(device=self.dev).manual_seed(0)  # values: drawn where they are used
        from engine.worker.kv_cache import resolve_kv_dtype
        self.kv_dtypes = {f: resolve_kv_dtype(f, self.dtype) for f in args.kv_dtypes.split(",")}  # refuses typos

    def earlier_rows(self) -> list[dict]:
        """Rows an earlier run wrote to --out for the cases this run does not run (the GPU plan runs
        this script in stages into one folder)."""
        path = Path(self.args.out or "") / "gpu_kernels.json"
        if not self.args.out or not path.is_file():
            return []
        mine = set(self.args.only.split(","))
        return [r for r in json.loads(path.read_text()).get("rows", []) if r.get("case") not in mine]

    def in_format(self, k, v, fmt: str):
        """The cache k, v (in self.dtype) stored in format fmt: (k, v, k_scale, v_scale)."""
        if fmt == "auto":
            return k, v, 1.0, 1.0
        dt = self.kv_dtypes[fmt]
        return (k / K_SCALE).to(dt), (v / V_SCALE).to(dt), K_SCALE, V_SCALE

    def time(self, fn) -> float:
        """Median seconds per call."""
        if self.dev == "cuda":
            from triton.testing import do_bench
            return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
        ts = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.dgen, device=self.dev, dtype=self.dtype)

    def paged(self, seq_lens: list[int], prefix: int = 0, extra_blocks: int = 0):
        """Random K/V for rows of the given lengths, all sharing their first prefix tokens' blocks;
        physical blocks shuffled, placed after extra_blocks unused ones. Returns k, v, tables."""
        torch, bs = self.torch, self.bs
        pb = prefix // bs
        own = [-(-s // bs) - pb for s in seq_lens]
        n = pb + sum(own)
        ids = torch.randperm(n, generator=self.gen) + 1 + extra_blocks
        width = pb + max(own)
        tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
        at = pb
        for b, o in enumerate(own):
            tables[b, :pb] = ids[:pb]
            tables[b, pb:pb + o] = ids[at:at + o]
            at += o
        N = n + 1 + extra_blocks
        k = torch.empty(N, bs, self.Hkv, self.D, dtype=self.dtype, device=self.dev)
        v = torch.empty_like(k)
        used = ids.to(self.dev).long()
        for c in (k, v):  # only the used blocks get values (a 2^31-element cache stays cheap to fill)
            c[used] = self.randn(n, bs, self.Hkv, self.D)
        return k, v, tables.to(self.dev)

    def i32(self, xs):
        return self.torch.tensor(xs, dtype=self.torch.int32, device=self.dev)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        if self.args.out:
            Path(self.args.out).mkdir(parents=True, exist_ok=True)
            (Path(self.args.out) / "gpu_kernels.json").write_text(json.dumps(dict(
                device=self.name, commit=commit(), dtype=str(self.dtype).removeprefix("torch."),
                heads=[self.Hq, self.Hkv, self.D], block_size=self.bs, copy_bw_GBps=self.copy_bw and self.copy_bw / 1e9,
                rows=self.rows), indent=1))


def kv_bytes(b: Bench, tokens: int, cache) -> int:
    """K and V bytes of `tokens` tokens in the format of cache (FP8: one byte per value)."""
    return tokens * 2 * b.Hkv * b.D * cache.element_size()


def case_copy(b: Bench, kernels):
    torch = b.torch
    n = (1 << 20) if b.tiny else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=b.dev)
    dst = torch.empty_like(src)
    b.copy_bw = 2 * n / b.time(lambda: dst.copy_(src))  # read + write
    m = 256 if b.tiny else 8192
    x, y = b.randn(m, m), b.randn(m, m)
    tflops = 2 * m ** 3 / b.time(lambda: x @ y) / 1e12
    b.add(dict(case="copy", copy_bw_GBps=b.copy_bw / 1e9, matmul_tflops=tflops))
    write_device_params(b.args.out, device=b.name, commit=commit(), copy_bw_GBps=b.copy_bw / 1e9,
                        matmul_tflops=tflops)


def case_paged(b: Bench, kernels):
    shapes = [(2, 100), (1, 300)] if b.tiny else [(32, 16384), (32, 32768), (4, 65536), (1, 131072), (256, 2048)]
    fracs = {fmt: {} for fmt in b.kv_dtypes}
    for B, L in shapes:
        k0, v0, bt = b.paged([L] * B)
        q, sl, sc = b.randn(B, b.Hq, b.D), b.i32([L] * B), 1 / math.sqrt(b.D)
        for fmt in b.kv_dtypes:
            k, v, ks, vs = b.in_format(k0, v0, fmt)
            run = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, k_scale=ks, v_scale=vs)  # noqa: E731
            err = rel_err(run(), kernels.paged_decode_ref(q.float(), k.float(), v.float(), bt, sl, sc,
                                                          k_scale=ks, v_scale=vs))
            t = b.time(run)
            frac = kv_bytes(b, B * L, k) / t / b.copy_bw
            fracs[fmt][f"B{B}_L{L}"] = frac
            b.add(dict(case="paged", kv_dtype=fmt, B=B, context=L, us=t * 1e6, bw_frac=frac, rel_err_vs_fp32=err))
            del k, v, run
        del k0, v0
        for fmt, fr in fracs.items():  # auto keeps the plain names; FP8 formats get theirs as a suffix
            sfx = "" if fmt == "auto" else f"_{fmt}"
            long = [f for key, f in fr.items() if int(key.split("_L")[1]) >= 16384]
            write_device_params(b.args.out, **{f"paged_decode_bw_frac{sfx}": fr,
                                               f"paged_decode_bw_frac_min_16k{sfx}": min(long) if long else None})


def _capture(b: Bench, fn):
    """fn replayed from a CUDA graph (a plain call on CPU). Returns (replay, output of the capture)."""
    if b.dev != "cuda":
        return fn, None
    fn()
    b.torch.cuda.synchronize()
    g = b.torch.cuda.CUDAGraph()
    with b.torch.cuda.graph(g):
        out = fn()
    return g.replay, out


def _graph_time(b: Bench, fn, errors: list) -> tuple[float, object]:
    """(seconds per replay of fn's graph, the capture's output); (nan, None) if capturing fails, the
    error added to errors, so that a failed capture costs its own figure only, not the case's eager ones."""
    try:
        replay, out = _capture(b, fn)
        return b.time(replay), out
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}"[:300])
        return float("nan"), None


def case_cascade(b: Bench, kernels):
    from engine.worker.cuda_graphs import bucket_sizes, pad_groups
    from pacore_kernels.cascade_decode import _block_n, cascade_prefix_plan
    from pacore_kernels.paged_decode import fill_target
    torch = b.torch
    shapes = {"round2": (3, 64, 16), "round1": (4, 32, 40)} if b.tiny else \
        {"round2": (4, 65536, 1024), "round1": (32, 512, 16384)}  # round 2's first: the plan's priority
    speed = {fmt: {} for fmt in b.kv_dtypes}
    for name, (K, P, S) in shapes.items():
        k0, v0, bt = b.paged([P + S] * K, prefix=P)
        q, sl, sc = b.randn(K, b.Hq, b.D), b.i32([P + S] * K), 1 / math.sqrt(b.D)
        gs, gp = b.i32([0, K]), b.i32([P])
        size = next(s for s in bucket_sizes(256) if s >= K)
        # graph-style, as engine/worker/cuda_graphs.py runs a batch: padded to its bucket (padding rows attend
        # to one token of block 0 and form groups of one), groups padded, max_group_size = bucket
        gs_pad, gp_pad = (t.to(b.dev) for t in pad_groups(gs.cpu(), gp.cpu(), K, size))
        pad = size - K
        q_pad = torch.cat([q, b.randn(pad, b.Hq, b.D)])
        bt_pad = torch.cat([bt, torch.zeros(pad, bt.shape[1], dtype=bt.dtype, device=b.dev)])
        sl_pad = torch.cat([sl, b.i32([1] * pad)])
        # The prefix plan of one step: layer 1 builds it, layers 2..LAYERS reuse it (work_plans).
        plan = lambda: cascade_prefix_plan(gs_pad, gp_pad, size, b.Hq, b.Hkv, size,  # noqa: E731
                                           bt.shape[1] * b.bs, fill_target(q.device), _block_n(b.D))
        t_plan, graph_errors = b.time(plan), []
        t_plan_g, _ = _graph_time(b, plan, graph_errors)
        for fmt in b.kv_dtypes:
            k, v, ks, vs = b.in_format(k0, v0, fmt)
            sk = dict(k_scale=ks, v_scale=vs)
            plans, graph_plans = {}, {}  # one step's, kept across the timed calls as across layers
            paged = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, **sk)  # noqa: E731
            paged_graph = lambda: kernels.paged_decode_triton(q_pad, k, v, bt_pad, sl_pad, sc, **sk)  # noqa: E731
            casc = lambda: kernels.cascade_decode_triton(q, k, v, bt, sl, gs, gp, sc, max_group_size=K,  # noqa: E731
                                                         work_plans=plans, **sk)
            casc_graph = lambda: kernels.cascade_decode_triton(q_pad, k, v, bt_pad, sl_pad, gs_pad, gp_pad, sc,  # noqa: E731
                                                               max_group_size=size, work_plans=graph_plans, **sk)[:K]
            ref = kernels.cascade_decode_ref(q.float(), k.float(), v.float(), bt, sl, gs, gp, sc, **sk)
            err = max(rel_err(casc(), ref), rel_err(casc_graph(), ref))
            t_paged, t_casc = b.time(paged), b.time(casc)
            t_paged_g, _ = _graph_time(b, paged_graph, graph_errors)
            t_casc_g, graph_out = _graph_time(b, casc_graph, graph_errors)
            if graph_out is not None:  # the output of the last replay
                err = max(err, rel_err(graph_out, ref))
            unique = kv_bytes(b, P + K * S, k)
            # per layer: the kernels plus the plan's share of the step
            speed[fmt][name] = dict(eager=t_paged / (t_casc + t_plan / LAYERS),
                                    graph=t_paged_g / (t_casc_g + t_plan_g / LAYERS))
            b.add(dict(case="cascade", kv_dtype=fmt, shape=name, K=K, prefix=P, suffix=S, bucket=size,
                       paged_us=t_paged * 1e6, cascade_us=t_casc * 1e6, paged_graph_us=t_paged_g * 1e6,
                       cascade_graph_us=t_casc_g * 1e6, plan_us=t_plan * 1e6, plan_graph_us=t_plan_g * 1e6,
                       layers=LAYERS, speedup_eager=speed[fmt][name]["eager"],
                       speedup_graph=speed[fmt][name]["graph"],
                       paged_bw_frac=kv_bytes(b, K * (P + S), k) / t_paged / b.copy_bw,
                       cascade_bw_frac=unique / t_casc / b.copy_bw, rel_err_vs_fp32=err,
                       **({"graph_errors": graph_errors} if graph_errors else {})))
            del k, v, ref, graph_out, paged, paged_graph, casc, casc_graph
            write_device_params(b.args.out, **{"cascade_speedup_vs_paged" + ("" if fmt == "auto" else f"_{fmt}"):
                                               speed[fmt]})
        del k0, v0


def case_prefill(b: Bench, kernels):
    import pacore_kernels.prefill_attention as pa
    torch = b.torch
    lens, chunk = ([96, 160], 32) if b.tiny else ([16384, 65536], 2048)
    default = pa.PREFILL_TILE
    tiles = [default, *(t for t in pa.PREFILL_TILES if t != default)]  # the default's numbers first
    tflops = {}
    for L in lens:
        k, v, bt = b.paged([L])
        pos = torch.arange(L, device=b.dev)
        slots = bt[0, pos // b.bs].long() * b.bs + pos % b.bs
        kn, vn = k.view(-1, b.Hkv, b.D)[slots], v.view(-1, b.Hkv, b.D)[slots]  # the prompt's own K/V
        q, sc = b.randn(L, b.Hq, b.D), 1 / math.sqrt(b.D)

        chunks = [(c0, min(L, c0 + chunk), b.i32([0, min(L, c0 + chunk) - c0]), b.i32([min(L, c0 + chunk)]))
                  for c0 in range(0, L, chunk)]  # (start, end, cu_seqlens_q, seq_lens) of each chunk's step

        def chunked():
            return torch.cat([kernels.prefill_attention_triton(q[c0:c1], k, v, bt, cu, sl, sc, sdpa=False)
                              for c0, c1, cu, sl in chunks])

        whole = lambda: kernels.prefill_attention_triton(q, k, v, bt, b.i32([0, L]), b.i32([L]), sc,  # noqa: E731
                                                         sdpa=False)
        sdpa = lambda: pa.prefill_sdpa(q, kn, vn, [0, L], sc)  # noqa: E731
        # The error is measured on the last `tail` queries, which see the most keys: the fp32 reference of
        # a whole 64k prompt could run SDPA's math path (fp32 has no flash kernel), 64k x 64k scores.
        tail = min(L, 256)
        ref = kernels.prefill_attention_ref(q[-tail:].float(), k.float(), v.float(), bt, b.i32([0, tail]), b.i32([L]),
                                            sc)
        flops = 4 * b.Hq * b.D * L * (L + 1) / 2  # causal: QK^T and PV over keys 0..=i for each query i
        row = dict(case="prefill", prompt=L, chunk=chunk, err_rows=tail)
        for tile in tiles:  # the prefill bf16 tiles against each other (PREFILL_TILE picks the kernel's)
            pa.PREFILL_TILE = tile
            try:
                for n, f in (("chunked", chunked), ("whole", whole)):
                    err, t = rel_err(f()[-tail:], ref), b.time(f)
                    tflops[f"{n}_{L}" if tile == default else f"{n}_{tile}_{L}"] = flops / t / 1e12
                    row.update({f"{n}_{tile}_ms": t * 1e3, f"{n}_{tile}_tflops": flops / t / 1e12,
                                f"{n}_{tile}_rel_err_vs_fp32": err})
            finally:
                pa.PREFILL_TILE = default
            b.add(dict(row, tile=tile))  # after each tile, so a timeout keeps what ran
        out = sdpa()
        if out is None:  # flash cannot run these inputs (the engine runs the Triton kernel then)
            row.update(sdpa_tflops=float("nan"), sdpa_unavailable=True)
        else:
            t = b.time(sdpa)
            tflops[f"sdpa_{L}"] = flops / t / 1e12
            row.update(sdpa_ms=t * 1e3, sdpa_tflops=flops / t / 1e12, sdpa_rel_err_vs_fp32=rel_err(out[-tail:], ref))
        del out
        fastest = max(tiles, key=lambda t: row[f"whole_{t}_tflops"])
        b.rows = [r for r in b.rows if not (r["case"] == "prefill" and r.get("prompt") == L)]
        b.add(dict(row, tiles=tiles, default_tile=default, fastest_tile=fastest))
        write_device_params(b.args.out, prefill_tflops=dict(tflops), **{f"prefill_fastest_tile_{L}": fastest})
        del k, v, ref


def case_offsets(b: Bench, kernels):
    """Two rows sharing a 512-token prefix, in the last blocks of a cache of > 2^31 elements per K/V."""
    torch = b.torch
    per_block = b.bs * b.Hkv * b.D
    extra = 8 if b.tiny else (1 << 31) // per_block + 8
    P, L = (32, 80) if b.tiny else (512, 1024)
    k, v, bt = b.paged([L, L], prefix=P, extra_blocks=extra)
    sc = 1 / math.sqrt(b.D)
    q, sl = b.randn(2, b.Hq, b.D), b.i32([L, L])
    # store two new tokens at the last slots, then attend over them
    new_k, new_v = b.randn(2, b.Hkv, b.D), b.randn(2, b.Hkv, b.D)
    slots = (bt[:, (L - 1) // b.bs].long() * b.bs + (L - 1) % b.bs)
    kernels.store_kvcache_triton(new_k, new_v, k, v, slots)
    stored = torch.equal(k.view(-1, b.Hkv, b.D)[slots], new_k) and torch.equal(v.view(-1, b.Hkv, b.D)[slots], new_v)
    kf, vf = k.float(), v.float()
    errs = dict(
        paged=rel_err(kernels.paged_decode_triton(q, k, v, bt, sl, sc),
                      kernels.paged_decode_ref(q.float(), kf, vf, bt, sl, sc)),
        cascade=rel_err(kernels.cascade_decode_triton(q, k, v, bt, sl, b.i32([0, 2]), b.i32([P]), sc, max_group_size=2),
                        kernels.cascade_decode_ref(q.float(), kf, vf, bt, sl, b.i32([0, 2]), b.i32([P]), sc)))
    qp, cu, sl1 = b.randn(64, b.Hq, b.D), b.i32([0, 64]), b.i32([L])
    errs["prefill"] = rel_err(kernels.prefill_attention_triton(qp, k, v, bt[:1], cu, sl1, sc),
                              kernels.prefill_attention_ref(qp.float(), kf, vf, bt[:1], cu, sl1, sc))
    b.add(dict(case="offsets", cache_elements=k.numel(), past_2_31=k.numel() > 2 ** 31, stored_exactly=stored,
               **{f"{n}_rel_err_vs_fp32": e for n, e in errs.items()}))


def case_replay(b: Bench, kernels):
    """One cascade graph (bucket 8) replayed with other lengths, tables and groups than it was captured with."""
    from engine.worker.cuda_graphs import pad_groups
    torch, size = b.torch, 8
    P = 32 if b.tiny else 1024
    scenarios = [([size], [P], [P + 40 + 7 * i for i in range(size)]),     # the capture's batch
                 ([3, 3], [P, 2 * P], [P + 5, P + 9, P + 30, 2 * P + 1, 2 * P + 17, 2 * P + 3]),
                 ([2, 1, 4], [P // 2, 0, P], [P + 50, P + 3, 20, P + 1, P + 8, P + 64, P + 2])]
    width = -(-(2 * P + 80) // b.bs)
    stat = dict(q=b.randn(size, b.Hq, b.D), tables=torch.zeros(size, width, dtype=torch.int32, device=b.dev),
                seq=b.i32([1] * size), gs=b.i32(list(range(size + 1))), gp=b.i32([0] * size))
    k, v, _ = b.paged([2 * P + 80] * 2 * size)  # one cache big enough for every scenario's blocks
    nblk, sc = k.shape[0], 1 / math.sqrt(b.D)

    def fn():
        return kernels.cascade_decode_triton(stat["q"], k, v, stat["tables"], stat["seq"], stat["gs"], stat["gp"],
                                             sc, max_group_size=size)
    errs = []
    replay = graph_out = None
    for groups, plens, seqs in scenarios:
        n = len(seqs)
        perm = (torch.randperm(nblk - 1, generator=b.gen) + 1).to(torch.int32)
        tables, r, used = torch.zeros(size, width, dtype=torch.int32), 0, 0
        for g, p in zip(groups, plens):  # members of a group share their prefix blocks
            shared = perm[used:used + p // b.bs]
            used += p // b.bs
            for _ in range(g):
                own = -(-seqs[r] // b.bs) - p // b.bs
                tables[r, :p // b.bs] = shared
                tables[r, p // b.bs:p // b.bs + own] = perm[used:used + own]
                used += own
                r += 1
        starts = torch.tensor([0] + torch.tensor(groups).cumsum(0).tolist(), dtype=torch.int32)
        gs, gp = pad_groups(starts, torch.tensor(plens, dtype=torch.int32), n, size)
        stat["tables"].copy_(tables)
        stat["seq"].copy_(torch.tensor(seqs + [1] * (size - n), dtype=torch.int32))
        stat["gs"].copy_(gs)
        stat["gp"].copy_(gp)
        stat["q"].copy_(b.randn(size, b.Hq, b.D))
        if replay is None:
            replay, graph_out = _capture(b, fn)
        out = fn() if graph_out is None else (replay(), graph_out)[1]
        ref = kernels.cascade_decode_ref(stat["q"][:n].float(), k.float(), v.float(), stat["tables"][:n],
                                         stat["seq"][:n], b.i32(starts.tolist()), b.i32(plens), sc)
        errs.append(rel_err(out[:n], ref))
    b.add(dict(case="replay", bucket=size, scenarios=len(scenarios), graph=b.dev == "cuda",
               max_rel_err_vs_fp32=max(errs)))


def format_table(rows, dtype: str = "bfloat16") -> str:
    """The rows as a table, each with its verdict against the fp32 reference (REL_TOL[dtype])."""
    lines = ["kernels at PaCoRe-8B's shape; bw = bytes read / time / device copy bandwidth (FP8: a byte a value); "
             f"err = max |out - fp32 reference| / max |reference|, verdict: err within {REL_TOL[dtype]:.0e} ({dtype})"]
    for r in rows:
        c, n = r["case"], len(lines)
        if c == "copy":
            lines.append(f"copy {r['copy_bw_GBps']:.0f} GB/s   bf16 matmul {r['matmul_tflops']:.0f} TFLOP/s")
        elif c == "paged":
            lines.append(f"paged   {r['kv_dtype']:<8} B={r['B']:<4} ctx={r['context']:<7} {r['us']:9.1f} us  "
                         f"bw {r['bw_frac']:.2f}  err {r['rel_err_vs_fp32']:.1e}")
        elif c == "cascade":
            lines.append(f"cascade {r['kv_dtype']:<8} {r['shape']} K={r['K']} P={r['prefix']} S={r['suffix']}: "
                         f"paged {r['paged_us']:.1f} us, cascade {r['cascade_us']:.1f} us + plan "
                         f"{r['plan_us']:.1f}/{r['layers']} ({r['speedup_eager']:.2f}x); "
                         f"graph {r['paged_graph_us']:.1f} "
                         f"vs {r['cascade_graph_us']:.1f} + {r['plan_graph_us']:.1f}/{r['layers']} us "
                         f"({r['speedup_graph']:.2f}x)  err {r['rel_err_vs_fp32']:.1e}")
        elif c == "prefill" and "fastest_tile" in r:
            per_tile = "  ".join(f"{t}: chunked {r[f'chunked_{t}_tflops']:.0f} whole {r[f'whole_{t}_tflops']:.0f}"
                                 for t in r["tiles"])
            lines.append(f"prefill {r['prompt']:>6}: {per_tile}  sdpa {r['sdpa_tflops']:.0f} TFLOP/s  "
                         f"(fastest {r['fastest_tile']}, default {r['default_tile']})  "
                         f"err {max(r[k] for k in r if k.endswith('fp32')):.1e}")
        elif c == "offsets":
            lines.append(f"offsets past 2^31: {r['past_2_31']}  stored {r['stored_exactly']}  err "
                         f"{max(r[k] for k in r if k.endswith('fp32')):.1e}")
        elif c == "replay":
            lines.append(f"graph replay, {r['scenarios']} batches (graph {r['graph']}): err {r['max_rel_err_vs_fp32']:.1e}")
        if len(lines) > n and verdict(r, dtype):  # the row made a line, and has errors to judge
            lines[-1] += f"  {verdict(r, dtype)}"
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    kernels = open_kernels(args.tiny, "gpu_kernels", "--tiny")
    if kernels is None:
        return 2
    b = Bench(args)
    print(f"device: {b.name}; {b.dtype}, Hq={b.Hq} Hkv={b.Hkv} D={b.D} bs={b.bs}", flush=True)
    only = set(args.only.split(","))
    if b.copy_bw is None:
        only.add("copy")  # every bandwidth needs the copy's
    cases = {name: globals()[f"case_{name}"] for name in CASES if name in only}
    return run_cases(b, kernels, cases, format_table, Path(args.out) / "gpu_kernels_table.txt" if args.out else None)


if __name__ == "__main__":
    sys.exit(main())
