"""Ahead-of-time compile every Triton kernel for a Hopper GPU (sm_90) on a host without one.

The interpreter tests check the maths; this catches what only the real compiler sees (types, dot
shapes, shared memory over the 227 KiB limit). It runs itself in a subprocess, because the kernels
must be created without TRITON_INTERPRET. Skips where triton or its bundled ptxas is missing.

Each kernel is compiled as a launch specializes it: every argument goes through Triton's own
launcher rule (``native_specialize_impl``, honouring the kernel's ``do_not_specialize``), so a
pointer (16-byte aligned, as torch allocates) and an integer divisible by 16 carry
``tt.divisibility = 16``, and an integer 1 becomes a constant. The integers are Qwen3-8B's strides
(32 query heads and 8 KV heads of 128). Without the hints the code differs from what runs (wider
loads are not proven safe), and so do its registers: ``--print`` lists each kernel's registers,
spills and shared memory, the figures docs/gpu.md quotes.
"""
import os
import sys

if __name__ != "__main__":  # the subprocess body must not switch the interpreter on
    import _triton_env as env  # noqa: F401  (must come first)
else:
    env = None

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMEM_LIMIT = 232448  # bytes of shared memory one block may use on sm_90


@pytest.mark.skipif(env is not None and env.DEVICE != "cpu",
                    reason="on a GPU the real kernels run in the other tests")
def test_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    run_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run_env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, __file__], cwd=ROOT, env=run_env, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # every kernel as a launch specializes it: its pointers (at least) carry the divisibility hint
    compiled = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert compiled and all(int(line.split("hinted=")[1].split()[0]) > 0 for line in compiled), proc.stdout


# ------------------------------------------------------------------ subprocess body
def _compile_all() -> int:
    sys.path.insert(0, str(ROOT))
    import torch
    import triton
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    from pacore_kernels import (activation, block_select, cascade_decode, fp8_gemm, gumbel_sample, paged_decode, prefill_attention, rmsnorm,
                         rope, store_kvcache)

    target = GPUTarget("cuda", 90, 32)
    tname = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
             torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}

    def compile_one(kernel, args: dict, consts: dict):
        """args: name -> torch.dtype (a pointer to it), int (an i32/i64 scalar) or float (fp32)."""
        sig, attrs = {}, {}
        for i, param in enumerate(kernel.params):
            name = param.name
            if name in consts:
                sig[name] = "constexpr"
                continue
            value = args[name]
            if isinstance(value, torch.dtype):
                value = torch.empty(16, dtype=value)  # its data_ptr is aligned, as a device allocation's
            kind, hint = native_specialize_impl(BaseBackend, value, param.is_const, not param.do_not_specialize,
                                                not param.do_not_specialize_on_alignment)
            if kind == "constexpr":  # an integer 1, as the launcher folds it
                sig[name], consts[name] = "constexpr", hint
            else:
                sig[name] = "*" + tname[value.dtype] if isinstance(value, torch.Tensor) else kind
                if isinstance(hint, str):
                    attrs[(i,)] = BaseBackend.parse_attr(hint)
        opts = {k: consts.pop(k) for k in ("num_warps", "num_stages") if k in consts}
        c = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs), target=target,
                           options=opts)
        assert c.metadata.shared <= SMEM_LIMIT, f"{kernel.fn.__name__} {consts}: shared {c.metadata.shared}"
        regs = ""
        if "--print" in sys.argv:  # registers and spills: from the cubin, through ptxas' report
            regs = " " + _registers(c.asm["ptx"])
        hinted = sum(1 for a in attrs.values() if a)
        print(f"ok {kernel.fn.__name__:24s} shared={c.metadata.shared:6d} hinted={hinted:2d}{regs} {consts}", flush=True)

    f32, i32 = torch.float32, torch.int32
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    # (q dtype, cache dtype, head_dim, q heads per kv head, start, queries per row (None: one, no
    # cu_seqlens_q), sink): the FP8 caches beside each model dtype; several queries per row (speculative
    # verification) for QMAX 1..8 and the sink + window of draft steps in the dtypes the engine launches.
    bf = torch.bfloat16
    decode = [(bf, bf, 128, 8, True, None, False), (torch.float16, torch.float16, 64, 1, False, None, False),
              (f32, f32, 128, 4, True, None, False), (bf, e4m3, 128, 8, True, None, False),
              (bf, e5m2, 128, 4, False, None, False), (torch.float16, e4m3, 64, 1, False, None, False),
              (f32, e4m3, 128, 4, True, None, False), (bf, bf, 128, 4, True, None, True), (bf, e4m3, 128, 4, True, None, True)]
    decode += [(bf, kv, 128, 8, False, qmax, False) for kv in (bf, e4m3) for qmax in (1, 2, 4, 8)]
    seen = set()
    for dt, kv, D, qpk, has_start, qmax, has_sink in decode:
        block_m = paged_decode.query_block_m(qpk, qmax or 1)
        key = (dt, kv, D, qpk, has_start, qmax is not None, has_sink, block_m)
        if key in seen:  # QMAX 1 and 2 with 8 q heads per kv head: one BLOCK_M, one compile
            continue
        seen.add(key)
        # a verify (several queries per row) also compiles with the block importance it emits for selection
        # "verify" (block_max [T, Hq, W] fp32: 32 q heads x 8,192 blocks at 131k)
        for store_bm in (False, True) if qmax else (False,):
            compile_one(paged_decode._decode_split_kernel,
                        dict(q_ptr=dt, kc_ptr=kv, vc_ptr=kv, bt_ptr=i32, seq_ptr=i32, start_ptr=i32, sink_ptr=i32,
                             cu_ptr=i32, o_ptr=f32, lse_ptr=f32, bm_ptr=f32, stride_qb=6144, stride_bt=64,
                             stride_tok=1024, stride_ob=32768, stride_oh=1024, stride_os=128, stride_lb=256,
                             stride_lh=8, stride_ls=1, stride_bmt=262144, stride_bmh=8192, split_off=3, NUM_SPLITS=5,
                             qk_scale=0.1, v_scale=1.0),
                        dict(QPK=qpk, QPK_P2=1 << (qpk - 1).bit_length(), D=D, BS=16, BLOCK_M=block_m,
                             BLOCK_N=64 if D <= 64 else 32, BLOCK_D=D, HAS_START=has_start, HAS_CU=qmax is not None,
                             HAS_SINK=has_sink, STORE_LSE=True, DOT_PREC=paged_decode.dot_precision(dt),
                             STORE_BM=store_bm, **paged_decode.launch_opts(dt)))
    compile_one(paged_decode._merge_splits_kernel,
                dict(o_part_ptr=f32, lse_part_ptr=f32, out_ptr=torch.bfloat16, lse_ptr=f32, n1_ptr=i32, S=7, S1=3,
                     stride_pb=32768, stride_ph=1024, stride_ps=128, stride_lb=256, stride_lh=8, stride_ob=4096,
                     stride_oh=128, stride_fb=32),
                dict(D=128, BLOCK_S=64, BLOCK_D=128, STORE_LSE=True, HAS_N1=True, num_warps=4))
    for dt, kv, D, qpk in [(torch.bfloat16, torch.bfloat16, 128, 8), (f32, f32, 128, 4),
                           (torch.float16, torch.float16, 64, 1), (torch.bfloat16, torch.bfloat16, 128, 3),
                           (torch.bfloat16, e4m3, 128, 8), (torch.bfloat16, e5m2, 128, 8), (f32, e4m3, 128, 4)]:
        block_m = 64
        compile_one(cascade_decode._cascade_prefix_kernel,
                    dict(q_ptr=dt, kc_ptr=kv, vc_ptr=kv, bt_ptr=i32, gs_ptr=i32, gq_ptr=i32, gp_ptr=i32, sp_ptr=i32, cum_ptr=i32,
                         o_ptr=f32, lse_ptr=f32, bm_ptr=f32, stride_qb=6144, stride_bt=64, stride_tok=1024,
                         stride_ob=32768, stride_oh=1024, stride_os=128, stride_lb=256, stride_lh=8, stride_ls=1,
                         stride_bmt=262144, stride_bmh=8192, G=4, HKV=8, NUM_PROGRAMS=264, qk_scale=0.1, v_scale=1.0),
                    dict(QPK=qpk, MT=block_m // qpk, D=D, BS=16, BLOCK_M=block_m, BLOCK_N=64 if D <= 64 else 32,
                         BLOCK_D=D, DOT_PREC=paged_decode.dot_precision(dt), STORE_BM=dt is torch.bfloat16,
                         **paged_decode.launch_opts(dt)))
    default_tile = prefill_attention.PREFILL_TILE
    other_tiles = [(torch.bfloat16, kv, 128, 4, t) for t in prefill_attention.PREFILL_TILES if t != default_tile
                   for kv in (torch.bfloat16, e4m3)]  # the tiles the GPU plan times against the default
    for dt, kv, D, qpk, tile in [(torch.bfloat16, torch.bfloat16, 128, 4, default_tile), (f32, f32, 128, 4, None),
                                 (torch.float16, torch.float16, 64, 3, default_tile),
                                 (torch.bfloat16, torch.bfloat16, 128, 1, default_tile),
                                 (torch.bfloat16, e4m3, 128, 4, default_tile), (torch.bfloat16, e5m2, 128, 1, default_tile),
                                 (f32, e4m3, 128, 4, None), *other_tiles]:
        prefill_attention.PREFILL_TILE = tile or default_tile
        block_m, block_n, warps = prefill_attention.prefill_blocks(dt, qpk, D)
        compile_one(prefill_attention._prefill_kernel,
                    dict(q_ptr=dt, kc_ptr=kv, vc_ptr=kv, bt_ptr=i32, cu_ptr=i32, seq_ptr=i32, tile_seq_ptr=i32,
                         tile_idx_ptr=i32, o_ptr=dt, stride_qt=4096, stride_ot=4096, stride_bt=64, stride_tok=1024,
                         S=3, qk_scale=0.1, v_scale=1.0),
                    dict(QPK=qpk, QPK_P2=1 << (qpk - 1).bit_length(), D=D, BS=16, BLOCK_M=block_m, BLOCK_N=block_n,
                         BLOCK_D=D, DOT_PREC=paged_decode.dot_precision(dt), num_warps=warps,
                         num_stages=paged_decode.launch_opts(dt)["num_stages"]))
    prefill_attention.PREFILL_TILE = default_tile
    for dt, kv, fp8_max in [(bf, bf, 0.0), (bf, e4m3, 448.0), (bf, e5m2, 57344.0), (f32, e4m3, 448.0),
                            (torch.float16, e5m2, 57344.0)]:
        compile_one(store_kvcache._store_kvcache_kernel,
                    dict(k_ptr=dt, v_ptr=dt, kc_ptr=kv, vc_ptr=kv, slot_ptr=torch.int64, stride_k=6144,
                         stride_v=6144, k_inv=1.0, v_inv=1.0),
                    dict(HD=1024, BLOCK=1024, FP8_MAX=fp8_max))
    for dt, res in [(bf, True), (f32, False)]:
        compile_one(rmsnorm._rmsnorm_kernel,
                    dict(x_ptr=dt, res_ptr=dt, w_ptr=dt, out_ptr=dt, res_out_ptr=dt, stride_x=4096, stride_r=4096,
                         H=4096, eps=1e-5),
                    dict(HAS_RES=res, BLOCK=4096, num_warps=4))
    compile_one(gumbel_sample._gumbel_argmax_kernel,
                dict(scores_ptr=f32, keys_ptr=torch.int64, out_ptr=torch.int64, V=151936, stride=151936),
                dict(BLOCK=2048, num_warps=8))
    for dt in (bf, f32):  # sparse self-drafting's block scores at Qwen3-8B's shape (64k tokens of blocks of 16)
        compile_one(block_select._block_scores_kernel,
                    dict(q_ptr=dt, lo_ptr=dt, hi_ptr=dt, bt_ptr=i32, lens_ptr=i32, out_ptr=f32, stride_qb=4096,
                         stride_qh=128, stride_bt=4096, stride_out=4096, W=4096, HQ=32, GROUP=4, HKV=8, BS=16,
                         SINK_B=1, RECENT_B=8),
                    dict(D=128, BLOCK_N=block_select.BLOCK_N, BLOCK_D=128, num_warps=4))
    compile_one(rope._rope_kernel,
                dict(pos_ptr=torch.int64, q_ptr=bf, k_ptr=bf, cs_ptr=f32, stride_q=6144, stride_k=6144, HQ=32, HKV=8),
                dict(HALF=64, BLOCK_HQ=32, BLOCK_HKV=8, BLOCK_HALF=64, num_warps=4))
    compile_one(activation._silu_and_mul_kernel, dict(x_ptr=bf, out_ptr=bf, stride_x=28672, I=14336),
                dict(BLOCK=1024, num_warps=4))
    for block_m in (16, 64):  # FP8 weights with 128x128 block scales (Qwen3-8B-FP8), e4m3 tensor cores
        compile_one(fp8_gemm._fp8_block_gemm_kernel,
                    dict(a_ptr=e4m3, b_ptr=e4m3, c_ptr=bf, as_ptr=f32, bs_ptr=f32, M=256, N=6144, K=4096,
                         stride_am=4096, stride_bn=4096, stride_cm=6144, stride_asm=32, stride_bsn=32),
                    dict(GROUP_N=128, BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=128, num_warps=4))
    return 0


def _registers(ptx: str) -> str:
    """ptxas' register and spill figures for sm_90 (the cubin Triton builds comes from the same run)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(src), "-o", str(Path(tmp) / "k.o")],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    return f"regs={regs[1] if regs else '?'} spill={spill[1] if spill else '?'}"


if __name__ == "__main__":
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except Exception as e:  # pragma: no cover
        print(f"triton's compiler is unavailable: {e}")
        sys.exit(3)
    sys.exit(_compile_all())
