"""Test environment for the kernel tests: import this FIRST in every tests/pacore_kernels/test_kernels_*.py.

- PACORE_TEST_DEVICE=cuda|cpu picks the device (default: cuda when available). On cpu the Triton
  interpreter runs the kernels (TRITON_INTERPRET must be set before the kernels are created, hence
  this module).
- PACORE_TEST_DTYPES="bfloat16,float16" sets the dtypes (default: fp32+fp16+bf16 on CPU, bf16+fp16 on
  CUDA). On CPU the bf16 kernels run with bf16 storage (q, K/V cache, outputs, p rounded to bf16 to
  nearest even) while the attention dots take fp32 operands (pacore_kernels/_utils.py attn_dot: the
  interpreter's bf16 tl.dot is wrong), so only the bf16 MMA itself is left to a GPU. A GPU skips fp32:
  every fp32 variant is compiled for sm_90 by test_kernels_compile and run on a GPU end to end by
  bench/gpu/engine_check.py (fp32 Triton + graphs vs torch), and each would be one more compile
  (tests/pacore_kernels/compile_count.py counts them).
Also holds the shared builders for paged caches whose unused slots and padding block are NaN, so any
unmasked read poisons the output.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

DEVICE = os.environ.get("PACORE_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
    # @triton.jit picks interpreter-or-compiler when a kernel module is imported. If something (an engine
    # test collected earlier) imported `pacore_kernels` before this ran, drop those modules so the test module's
    # own import re-creates the kernels in interpreter mode.
    for _name in [m for m in sys.modules if m == "pacore_kernels" or m.startswith("pacore_kernels.")]:
        del sys.modules[_name]


def _round_bf16_like_a_gpu() -> None:
    """The interpreter converts fp32 -> bf16 by dropping mantissa bits; a GPU rounds to nearest even
    (cvt.rn.bf16.f32), as torch does. Its cast is replaced by torch's, so bf16 kernels round where and as
    they will on a GPU and their tests can demand it (an interpreter without this cast is left alone)."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
        real = InterpreterBuilder.cast_impl
    except (ImportError, AttributeError):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.tensor(np.asarray(src.data, dtype=np.float32)).to(torch.bfloat16)
            return TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return real(self, src, dst_type)
    InterpreterBuilder.cast_impl = cast_impl


if DEVICE == "cpu":
    _round_bf16_like_a_gpu()

_default = "float32,float16,bfloat16" if DEVICE == "cpu" else "bfloat16,float16"
DTYPES = [getattr(torch, n.strip()) for n in os.environ.get("PACORE_TEST_DTYPES", _default).split(",") if n.strip()]
LOW_DTYPES = [d for d in DTYPES if d != torch.float32]
DTYPE = DTYPES[0]  # the one dtype of the tests that check logic rather than precision
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def grid(cases: list, gpu_other: list[int] | None = None, gpu_first: list[int] | None = None) -> list[tuple]:
    """(dtype, *case) rows for a kernel test's parametrize. On CPU: every dtype x every case. On a GPU,
    where each distinct specialisation is one more compile (~0.5-1 s), the first dtype (bf16, the
    engine's) runs the cases at indices gpu_first (default: all) and the other dtypes those at gpu_other
    (default: all). The subsets are chosen so that every compiled tile shape and kernel branch (head
    dim, BLOCK_M, cache format, split or direct output) still runs on the GPU in every dtype; what only
    changes index arithmetic (GQA ratios, block sizes) runs there in bf16 and under the interpreter in
    every dtype. PACORE_TEST_GRID=gpu picks the GPU's rows on a CPU (tests/pacore_kernels/compile_count.py)."""
    if DEVICE == "cpu" and os.environ.get("PACORE_TEST_GRID") != "gpu":
        return [(d, *c) for d in DTYPES for c in cases]
    rows = []
    for i, d in enumerate(DTYPES):
        keep = gpu_first if i == 0 else gpu_other
        rows += [(d, *c) for j, c in enumerate(cases) if keep is None or j in keep]
    return rows


def have_triton() -> bool:
    try:
        import triton  # noqa: F401
        return True
    except Exception:
        return False


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "output has NaN"
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-12345)


def make_paged(seq_lens, bs, Hkv, D, dtype, device=DEVICE, groups=None, prefix_lens=None, gen=None):
    """Random paged K/V for sequences of the given lengths.

    groups: list of group sizes (rows contiguous); members of group g share their first
    prefix_lens[g] // bs blocks. Returns k_cache, v_cache, block_tables (int32, padded with 0).
    Physical block 0 is never allocated and, like every unused slot, holds NaN.
    """
    B = len(seq_lens)
    if groups is None:
        groups, prefix_lens = [1] * B, [0] * B
    assert sum(groups) == B
    nblk = [(s + bs - 1) // bs for s in seq_lens]
    max_blocks = max(nblk + [1]) + 1  # one spare padding column
    tables = torch.zeros(B, max_blocks, dtype=torch.int32)
    next_id = 1
    row = 0
    for gsize, plen in zip(groups, prefix_lens):
        assert plen % bs == 0
        shared = list(range(next_id, next_id + plen // bs))
        next_id += len(shared)
        for _ in range(gsize):
            assert seq_lens[row] >= plen
            own = list(range(next_id, next_id + nblk[row] - len(shared)))
            next_id += len(own)
            tables[row, : nblk[row]] = torch.tensor(shared + own, dtype=torch.int32)
            row += 1
    N = next_id
    perm = torch.randperm(N - 1, generator=gen) + 1  # shuffle physical ids, keep 0 unused
    remap = torch.cat([torch.zeros(1, dtype=torch.int64), perm])
    used_cols = torch.arange(max_blocks)[None, :] < torch.tensor(nblk)[:, None]
    tables = torch.where(used_cols, remap[tables.long()], torch.zeros_like(tables.long())).to(torch.int32)

    k = torch.randn(N, bs, Hkv, D, generator=gen)
    v = torch.randn(N, bs, Hkv, D, generator=gen)
    used = torch.zeros(N * bs, dtype=torch.bool)
    for b, s in enumerate(seq_lens):
        pos = torch.arange(s)
        used[tables[b, pos // bs].long() * bs + pos % bs] = True
    used = used.view(N, bs, 1, 1)
    k = torch.where(used, k, float("nan")).to(dtype=dtype, device=device)
    v = torch.where(used, v, float("nan")).to(dtype=dtype, device=device)
    return k, v, tables.to(device)


def naive_attention(q, k_cache, v_cache, table_row, positions_by_query, sm_scale):
    """Dense fp64 SDPA per query over explicitly gathered positions. q [n, Hq, D]."""
    import torch.nn.functional as F
    _, bs, Hkv, D = k_cache.shape
    Hq = q.shape[1]
    outs = []
    for i, pos in enumerate(positions_by_query):
        if len(pos) == 0:
            outs.append(torch.zeros(Hq, D, dtype=torch.float64, device=q.device))
            continue
        pos = torch.as_tensor(pos, device=q.device)
        slots = table_row[pos // bs].long() * bs + pos % bs
        k = k_cache.reshape(-1, Hkv, D)[slots].double().transpose(0, 1)  # [Hkv, L, D]
        v = v_cache.reshape(-1, Hkv, D)[slots].double().transpose(0, 1)
        k = k.repeat_interleave(Hq // Hkv, dim=0)
        v = v.repeat_interleave(Hq // Hkv, dim=0)
        o = F.scaled_dot_product_attention(q[i].double()[:, None, :], k, v, scale=sm_scale)
        outs.append(o[:, 0, :])
    return torch.stack(outs)


def poison_allocations(monkeypatch):
    """Make torch.empty/empty_like return NaN-filled float tensors, so an output element a kernel
    forgets to write shows up as NaN instead of a lucky zero."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def empty(*a, **kw):
        return poison(real_empty(*a, **kw))

    def empty_like(*a, **kw):
        return poison(real_empty_like(*a, **kw))

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)


def poison_fixture():
    """An autouse fixture applying poison_allocations to every test of a module: `_poison = env.poison_fixture()`."""
    @pytest.fixture(autouse=True)
    def _poison(monkeypatch):
        poison_allocations(monkeypatch)
    return _poison


def record_compile_keys(setattr_fn, seen: dict) -> None:
    """Make every interpreted kernel launch add its compile key to seen[kernel name] (a set): the key the
    CUDA launcher computes (constexprs, launch options, and each other argument's ==1 / %16 / dtype
    specialisation unless do_not_specialize), so len(seen[name]) is the compiles a GPU run would make.
    setattr_fn: monkeypatch.setattr in a test, setattr elsewhere."""
    import inspect

    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import interpreter

    backend = type(make_backend(GPUTarget("cuda", 90, 32)))
    real_run = interpreter.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        sig = inspect.signature(self.fn)
        fixed = set(self.kwargs.get("do_not_specialize") or ())
        bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters}).arguments
        key = []
        for name, p in sig.parameters.items():
            v = bound.get(name, p.default)
            if "constexpr" in str(p.annotation):
                key.append(repr(v))
            else:
                key.append(str(native_specialize_impl(backend, v, False, name not in fixed, name not in fixed)))
        key.append(repr(sorted((k, v) for k, v in kwargs.items() if k not in sig.parameters)))
        seen.setdefault(self.fn.__name__, set()).add(tuple(key))
        return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    setattr_fn(interpreter.InterpretedFunction, "run", run)
