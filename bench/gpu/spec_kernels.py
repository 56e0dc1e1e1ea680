"""The speculative-decoding attention kernels at PaCoRe-8B's shape (issues 29 and 30), on one GPU.

Qwen3-8B heads (32 q, 8 kv, head_dim 128), bf16 queries, the KV cache in bf16 and in fp8_e4m3, block 16.
Every call is timed replayed from a CUDA graph (so launch overheads do not count, and the kernels are
shown to capture), L2 flushed before each replay, median of REPS; its output is checked against the fp32
reference (on the first two rows, except cascade). Cases, each row written to OUT/gpu_spec_kernels.json as soon as it ran:

- verify: B=32 rows x 16k and 32k context, q_len 1 (plain decode, no cu_seqlens_q), 3 and 5: time per
  call, KV bytes read / time, and time(q_len) / time(plain). The claim to check: verify(5) / plain ~ 1,
  because each row's KV is read once for all its queries and decode is bound by that read;
- cascade: round 2's shape, 4 rows sharing a 64k prefix + 8k own tokens, q_len 1 and 5, beside the paged
  multi-query kernel on the same batch (which reads the prefix once per row);
- draft: B=32 x 32k, one query per row over a sink of 16 + a window of 512 (self-drafting), vs the full
  paged decode of the same rows;
- sparse: the same rows drafting over sink 16 + window 128 + 384 tokens of selected blocks (issue 46: the
  Quest-style block scores, pacore_kernels/block_select.py, then the paged decode over the reduced table),
  beside the 16 + 512 window draft: the scores checked against the reference's, the output against the
  reference decode over the same (the Triton selection's) block tables, and the share of the reference
  selection's blocks it chose too (``selected_blocks_as_ref``: a near-tie may pick another block);
- importance: the verify of q_len 5 at 32k that also emits the block importance (selection "verify",
  pacore_kernels/block_importance.py: each score folded into a per-block max by an atomic, then normalised),
  beside the same verify without: what the by-product costs; the importance checked against the reference;
- sample: the sampler's Gumbel-max kernel (pacore_kernels/gumbel_sample.py) on B=256 rows x Qwen3's 151,936
  fp32 logits: time per call, logits bytes / time, and its tokens against the torch reference's.

    python3 -m bench.gpu.spec_kernels [--out DIR] [--only verify,cascade,draft] [--kv-dtypes auto,fp8_e4m3]
    python3 -m bench.gpu.spec_kernels --dry-run   # CPU, Triton interpreter, tiny shapes: the code path only
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

from bench.gpu.kernels import REL_TOL, commit, open_kernels, rel_err, run_cases, verdict, write_device_params

CASES = ("verify", "draft", "sparse", "importance", "cascade", "sample")
K_SCALE, V_SCALE = 0.5, 0.25  # an FP8 cache's scales: not 1, so the folded scales run too
REPS = 10


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", "--tiny", dest="tiny", action="store_true",
                    help="CPU under TRITON_INTERPRET=1 at tiny shapes (no numbers, the code path)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for the json and the table")
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--kv-dtypes", default="auto,fp8_e4m3", help="KV cache formats (auto, fp8_e4m3, fp8_e5m2)")
    return ap.parse_args(argv)


class Spec:
    """Shapes, the timer, the shared caches and the incremental json of one run."""

    def __init__(self, args):
        import torch
        from engine.worker.kv_cache import resolve_kv_dtype
        self.torch, self.args, self.tiny = torch, args, args.tiny
        self.dev = "cpu" if args.tiny else "cuda"
        self.dtype = torch.float32 if args.tiny else torch.bfloat16
        self.Hq, self.Hkv, self.D = (4, 2, 64) if args.tiny else (32, 8, 128)
        self.bs = 16
        self.name = "cpu (interpreter)" if args.tiny else torch.cuda.get_device_name()
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        self.kv_dtypes = {f: resolve_kv_dtype(f, self.dtype) for f in args.kv_dtypes.split(",")}  # refuses typos
        self.rows: list[dict] = []
        self.copy_bw = None
        self.t0 = time.perf_counter()
        self._flush = None if args.tiny else torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.gen, device=self.dev, dtype=self.dtype)

    def i32(self, xs):
        return self.torch.tensor(xs, dtype=self.torch.int32, device=self.dev)

    def cache(self, seq_lens: list[int], prefix: int = 0):
        """Random K/V (drawn on the device) for rows of the given lengths sharing their first `prefix`
        tokens' blocks, physical blocks shuffled. Returns {format: (k, v, k_scale, v_scale)}, tables."""
        torch, bs = self.torch, self.bs
        pb = prefix // bs
        own = [-(-s // bs) - pb for s in seq_lens]
        n = pb + sum(own)
        ids = torch.randperm(n, device=self.dev, generator=self.gen).to(torch.int32) + 1
        tables = torch.zeros(len(seq_lens), pb + max(own), dtype=torch.int32, device=self.dev)
        at = pb
        for b, o in enumerate(own):
            tables[b, :pb] = ids[:pb]
            tables[b, pb:pb + o] = ids[at:at + o]
            at += o
        k, v = (self.randn(n + 1, bs, self.Hkv, self.D) for _ in range(2))
        caches = {}
        for fmt, dt in self.kv_dtypes.items():
            caches[fmt] = (k, v, 1.0, 1.0) if fmt == "auto" else \
                ((k / K_SCALE).to(dt), (v / V_SCALE).to(dt), K_SCALE, V_SCALE)
        return caches, tables

    def kv_bytes(self, tokens: int, cache) -> int:
        return tokens * 2 * self.Hkv * self.D * cache.element_size()

    def time(self, fn) -> tuple[float, bool]:
        """(median seconds per call, whether it ran from a CUDA graph). On the GPU: fn captured in a graph
        (eager if capture fails), L2 flushed before each replay, timed by CUDA events around it."""
        torch = self.torch
        if self.dev != "cuda":
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0, False
        fn()  # compile, and the warm-up capture needs the allocator warmed
        torch.cuda.synchronize()
        run, graph = fn, False
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run, graph = g.replay, True
        except Exception as e:  # noqa: BLE001 - the row says it was timed eagerly, and why
            print(f"  capture failed ({type(e).__name__}: {e}); timing eagerly", flush=True)
        for _ in range(3):
            run()
        ts = []
        for _ in range(REPS):
            self._flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e-3)
        return statistics.median(ts), graph

    def measure_copy(self) -> None:
        torch = self.torch
        n = (1 << 20) if self.tiny else (1 << 30)
        src = torch.empty(n, dtype=torch.uint8, device=self.dev)
        dst = torch.empty_like(src)
        self.copy_bw = 2 * n / self.time(lambda: dst.copy_(src))[0]  # read + write

    def add(self, row: dict) -> None:
        if "us" in row and "kv_bytes" in row:
            row["GBps"] = row["kv_bytes"] / (row["us"] * 1e-6) / 1e9
            row["bw_frac"] = row["GBps"] * 1e9 / self.copy_bw
        row["elapsed_s"] = time.perf_counter() - self.t0  # since start: compiles included (the 60 s budget)
        self.rows.append(row)
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        if self.args.out:
            Path(self.args.out).mkdir(parents=True, exist_ok=True)
            (Path(self.args.out) / "gpu_spec_kernels.json").write_text(json.dumps(dict(
                device=self.name, commit=commit(), dtype=str(self.dtype).removeprefix("torch."),
                heads=[self.Hq, self.Hkv, self.D], block_size=self.bs, reps=REPS,
                copy_bw_GBps=self.copy_bw and self.copy_bw / 1e9, rows=self.rows), indent=1))


def _queries(s: Spec, B: int, q_len: int):
    """q [B * q_len, Hq, D] and cu_seqlens_q (None for one query per row: the plain decode call)."""
    q = s.randn(B * q_len, s.Hq, s.D)
    return q, (None if q_len == 1 else s.i32([i * q_len for i in range(B + 1)]))


def case_verify(s: Spec, kernels):
    B, lens, qlens = (2, [40, 70], [1, 3, 5]) if s.tiny else (32, [16384, 32768], [1, 3, 5])
    caches, bt = s.cache([max(lens)] * B)
    sc = 1 / math.sqrt(s.D)
    ratio = {}
    for fmt, (k, v, ks, vs) in caches.items():
        for L in lens:
            sl = s.i32([L] * B)
            plain = None
            for ql in qlens:
                q, cu = _queries(s, B, ql)
                kw = dict(k_scale=ks, v_scale=vs, cu_seqlens_q=cu, max_query_len=ql if cu is not None else None)
                run = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, **kw)  # noqa: E731

                ref = kernels.paged_decode_ref(q[:2 * ql].float(), k, v, bt[:2], sl[:2], sc, k_scale=ks, v_scale=vs,
                                               cu_seqlens_q=None if cu is None else cu[:3])  # the first 2 rows
                err = rel_err(run()[:2 * ql], ref)
                t, graph = s.time(run)
                plain = plain or t
                ratio.setdefault(fmt, {})[f"L{L}_q{ql}"] = t / plain
                s.add(dict(case="verify", kv_dtype=fmt, B=B, context=L, q_len=ql, us=t * 1e6, graph=graph,
                           kv_bytes=s.kv_bytes(B * L, k), vs_plain=t / plain, rel_err_vs_fp32=err))
    write_device_params(s.args.out, spec_verify_time_over_plain=ratio)


def case_draft(s: Spec, kernels):
    B, L, sink, window = (2, 70, 4, 16) if s.tiny else (32, 32768, 16, 512)
    caches, bt = s.cache([L] * B)
    sc = 1 / math.sqrt(s.D)
    q, sl = s.randn(B, s.Hq, s.D), s.i32([L] * B)
    st, sk = s.i32([L - window] * B), s.i32([sink] * B)
    for fmt, (k, v, ks, vs) in caches.items():
        full = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, k_scale=ks, v_scale=vs)  # noqa: E731
        draft = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, start_lens=st, sink_lens=sk,  # noqa: E731
                                                    k_scale=ks, v_scale=vs)
        ref = kernels.paged_decode_ref(q[:2].float(), k, v, bt[:2], sl[:2], sc, start_lens=st[:2], sink_lens=sk[:2],
                                       k_scale=ks, v_scale=vs)  # the first 2 rows
        err = rel_err(draft()[:2], ref)
        t_full, _ = s.time(full)
        t_draft, graph = s.time(draft)
        s.add(dict(case="draft", kv_dtype=fmt, B=B, context=L, sink=sink, window=window, us=t_draft * 1e6,
                   graph=graph, kv_bytes=s.kv_bytes(B * (sink + window), k), full_us=t_full * 1e6,
                   full_over_draft=t_full / t_draft, rel_err_vs_fp32=err))


def sparse_errors(kernels, bsel, q, k, v, bounds, bt, sl, bs: int, spans, sc: float, ks: float, vs: float):
    """(the sparse decode's error against the fp32 reference over the same block tables, the share of
    the reference selection's blocks the Triton selection chose too), for the first 2 rows. The decode
    is compared over the Triton selection's tables: a near-tie that the two score paths break apart
    picks another block, which would otherwise count as a decode error."""
    tables, lens = bsel.select_blocks_triton(q, bounds, bt, sl, bs, *spans)
    ref = kernels.paged_decode_ref(q[:2].float(), k, v, tables[:2], lens[:2], sc, k_scale=ks, v_scale=vs)
    err = rel_err(kernels.paged_decode_triton(q, k, v, tables, lens, sc, k_scale=ks, v_scale=vs)[:2], ref)
    ref_tables, ref_lens = bsel.select_blocks_ref(q[:2], bounds, bt[:2], sl[:2], bs, *spans)
    chosen = [-(-int(n) // bs) for n in ref_lens]
    same = sum(len(set(tables[i, :n].tolist()) & set(ref_tables[i, :n].tolist())) for i, n in enumerate(chosen))
    return err, same / max(1, sum(chosen))


def case_sparse(s: Spec, kernels):
    from pacore_kernels import block_select as bsel
    B, L, sink, window, selected = (2, 70, 4, 16, 16) if s.tiny else (32, 32768, 16, 128, 384)
    caches, bt = s.cache([L] * B)
    sc = 1 / math.sqrt(s.D)
    q, sl = s.randn(B, s.Hq, s.D), s.i32([L] * B)
    spans = (-(-sink // s.bs), selected // s.bs, window // s.bs)
    k0 = caches[next(iter(caches))][0]  # the model-dtype keys: what the bounds are kept from
    bounds = bsel.allocate_key_bounds(1, k0.shape[0], s.Hkv, s.D, s.dtype, s.dev)[0]
    bsel.update_key_bounds(bounds, k0.flatten(0, 1), s.torch.arange(k0.shape[0] * s.bs, device=s.dev), s.bs)
    scores = bsel.block_scores_triton(q, bounds, bt, sl, s.bs, spans[0], spans[2])
    ref_scores = bsel.block_scores_ref(q[:2], bounds, bt[:2], sl[:2], s.bs, spans[0], spans[2])
    keep = s.torch.isfinite(ref_scores)
    score_err = rel_err(scores[:2][keep], ref_scores[keep])
    for fmt, (k, v, ks, vs) in caches.items():
        def sparse():
            tables, lens = bsel.select_blocks_triton(q, bounds, bt, sl, s.bs, *spans)
            return kernels.paged_decode_triton(q, k, v, tables, lens, sc, k_scale=ks, v_scale=vs)
        st, sk = s.i32([L - (32 if s.tiny else 512)] * B), s.i32([sink] * B)  # the window draft's 16 + 512
        window_draft = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, start_lens=st, sink_lens=sk,  # noqa: E731
                                                           k_scale=ks, v_scale=vs)
        err, same_blocks = sparse_errors(kernels, bsel, q, k, v, bounds, bt, sl, s.bs, spans, sc, ks, vs)
        t_window, _ = s.time(window_draft)
        t_sparse, graph = s.time(sparse)
        read = sum(spans) * s.bs
        s.add(dict(case="sparse", kv_dtype=fmt, B=B, context=L, sink=sink, window=window, selected=selected,
                   us=t_sparse * 1e6, graph=graph, kv_bytes=s.kv_bytes(B * read, k) + B * (L // s.bs) * 2 * s.Hkv * s.D
                   * bounds.element_size(), window_us=t_window * 1e6, sparse_over_window=t_sparse / t_window,
                   rel_err_vs_fp32=err, scores_rel_err_vs_fp32=score_err, selected_blocks_as_ref=same_blocks))


def case_importance(s: Spec, kernels):
    B, L, ql = (2, 70, 5) if s.tiny else (32, 32768, 5)
    caches, bt = s.cache([L] * B)
    sc, sl = 1 / math.sqrt(s.D), s.i32([L] * B)
    q, cu = _queries(s, B, ql)
    imp = s.torch.empty(bt.shape, dtype=s.torch.float32, device=s.dev)
    for fmt, (k, v, ks, vs) in caches.items():
        kw = dict(k_scale=ks, v_scale=vs, cu_seqlens_q=cu, max_query_len=ql)
        plain = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, **kw)  # noqa: E731
        emit = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, importance=imp, **kw)  # noqa: E731
        ref = s.torch.empty(2, bt.shape[1], dtype=s.torch.float32, device=s.dev)
        kernels.paged_decode_ref(q[:2 * ql].float(), k, v, bt[:2], sl[:2], sc, k_scale=ks, v_scale=vs,
                                 cu_seqlens_q=cu[:3], importance=ref)
        emit()
        err = rel_err(imp[:2], ref)
        t_plain, _ = s.time(plain)
        t_emit, graph = s.time(emit)
        s.add(dict(case="importance", kv_dtype=fmt, B=B, context=L, q_len=ql, us=t_emit * 1e6, graph=graph,
                   kv_bytes=s.kv_bytes(B * L, k), plain_us=t_plain * 1e6, over_plain=t_emit / t_plain,
                   rel_err_vs_fp32=err))


def case_cascade(s: Spec, kernels):
    K, P, S = (2, 32, 16) if s.tiny else (4, 65536, 8192)
    caches, bt = s.cache([P + S] * K, prefix=P)
    sc = 1 / math.sqrt(s.D)
    sl, gs, gp = s.i32([P + S] * K), s.i32([0, K]), s.i32([P])
    for fmt, (k, v, ks, vs) in caches.items():
        t1 = None
        for ql in (1, 5):
            q, cu = _queries(s, K, ql)
            kw = dict(k_scale=ks, v_scale=vs, cu_seqlens_q=cu, max_query_len=ql if cu is not None else None)
            casc = lambda: kernels.cascade_decode_triton(q, k, v, bt, sl, gs, gp, sc, max_group_size=K, **kw)  # noqa: E731
            paged = lambda: kernels.paged_decode_triton(q, k, v, bt, sl, sc, **kw)  # noqa: E731
            ref = kernels.cascade_decode_ref(q.float(), k, v, bt, sl, gs, gp, sc, k_scale=ks, v_scale=vs,
                                             cu_seqlens_q=cu)
            err = rel_err(casc(), ref)
            t_casc, graph = s.time(casc)
            t_paged, _ = s.time(paged)
            t1 = t1 or t_casc
            s.add(dict(case="cascade", kv_dtype=fmt, K=K, prefix=P, suffix=S, q_len=ql, us=t_casc * 1e6, graph=graph,
                       kv_bytes=s.kv_bytes(P + K * S, k), paged_us=t_paged * 1e6, paged_over_cascade=t_paged / t_casc,
                       vs_q1=t_casc / t1, rel_err_vs_fp32=err))
            del ref


def case_sample(s: Spec, kernels):
    torch = s.torch
    B, V = (4, 3000) if s.tiny else (256, 151936)
    scores = torch.randn(B, V, generator=s.gen, device=s.dev, dtype=torch.float32) * 3
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (B,), generator=s.gen, device=s.dev, dtype=torch.int64)
    run = lambda: kernels.gumbel_argmax_triton(scores, keys)  # noqa: E731
    same = int((run() == kernels.gumbel_argmax_ref(scores, keys)).sum())
    t, graph = s.time(run)
    s.add(dict(case="sample", kv_dtype="-", B=B, vocab=V, us=t * 1e6, graph=graph,
               GBps=B * V * 4 / t / 1e9, same_tokens_as_ref=same, rel_err_vs_fp32=0.0 if same == B else 1.0))


def format_table(rows, dtype: str = "bfloat16") -> str:
    """The rows as a table, each with its verdict against the fp32 reference (REL_TOL[dtype]; the sampler:
    every token as the torch reference's)."""
    lines = ["speculative-decoding attention at PaCoRe-8B's shape; GB/s = KV bytes read once per row (cascade: "
             f"the prefix once) / time; bw = that / copy bandwidth; verdict: err within {REL_TOL[dtype]:.0e} ({dtype})"]
    for r in rows:
        head = f"{r['case']:<8}{r['kv_dtype']:<9}"
        if r["case"] == "verify":
            lines.append(f"{head}B={r['B']} ctx={r['context']:<6} q_len={r['q_len']}: {r['us']:8.1f} us  "
                         f"{r['GBps']:6.0f} GB/s  bw {r['bw_frac']:.2f}  x{r['vs_plain']:.2f} of plain  "
                         f"err {r['rel_err_vs_fp32']:.1e}")
        elif r["case"] == "draft":
            lines.append(f"{head}B={r['B']} ctx={r['context']} sink {r['sink']} + window {r['window']}: "
                         f"{r['us']:.1f} us ({r['GBps']:.0f} GB/s) vs full {r['full_us']:.1f} us: "
                         f"{r['full_over_draft']:.1f}x  err {r['rel_err_vs_fp32']:.1e}")
        elif r["case"] == "sparse":
            lines.append(f"{head}B={r['B']} ctx={r['context']} sink {r['sink']} + window {r['window']} + selected "
                         f"{r['selected']}: {r['us']:.1f} us ({r['GBps']:.0f} GB/s, bounds read included) vs the "
                         f"window draft {r['window_us']:.1f} us: x{r['sparse_over_window']:.2f}  err "
                         f"{r['rel_err_vs_fp32']:.1e}")
        elif r["case"] == "importance":
            lines.append(f"{head}B={r['B']} ctx={r['context']} q_len={r['q_len']} with block importance: "
                         f"{r['us']:.1f} us ({r['GBps']:.0f} GB/s) vs {r['plain_us']:.1f} us without: "
                         f"x{r['over_plain']:.2f}  err {r['rel_err_vs_fp32']:.1e}")
        elif r["case"] == "cascade":
            lines.append(f"{head}K={r['K']} P={r['prefix']} S={r['suffix']} q_len={r['q_len']}: {r['us']:.1f} us "
                         f"({r['GBps']:.0f} GB/s, x{r['vs_q1']:.2f} of q_len 1), paged {r['paged_us']:.1f} us "
                         f"({r['paged_over_cascade']:.2f}x)  err {r['rel_err_vs_fp32']:.1e}")
        elif r["case"] == "sample":
            lines.append(f"sample   B={r['B']} vocab={r['vocab']}: {r['us']:.1f} us ({r['GBps']:.0f} GB/s of logits), "
                         f"{r['same_tokens_as_ref']}/{r['B']} tokens as the torch reference")
        else:
            continue
        lines[-1] += f"  {verdict(r, dtype)}"
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    kernels = open_kernels(args.tiny, "gpu_spec_kernels", "--dry-run")
    if kernels is None:
        return 2
    s = Spec(args)
    print(f"device: {s.name}; {s.dtype}, Hq={s.Hq} Hkv={s.Hkv} D={s.D} bs={s.bs}", flush=True)
    s.measure_copy()
    only = set(args.only.split(","))
    cases = {name: globals()[f"case_{name}"] for name in CASES if name in only}
    return run_cases(s, kernels, cases, format_table, Path(args.out) / "gpu_spec_kernels_table.txt" if args.out else None)


if __name__ == "__main__":
    sys.exit(main())
