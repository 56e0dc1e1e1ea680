"""FP8 (e4m3) linear layers: weights in one byte with fp32 scales, activations quantized per token.

Two weight layouts (engine/quant/fp8.py):

- per output channel: ``w_scale`` [N], one scale per weight row (quantized at load, as vLLM's dynamic
  ``--quantization fp8``); activations get one scale per token;
- blocks: ``w_scale`` [ceil(N / bn), ceil(K / bk)], one per bn x bk tile (a pre-quantized checkpoint's
  ``weight_scale_inv``, e.g. Qwen3-8B-FP8's 128 x 128); activations get one scale per token per bk
  columns, so each bk-wide slice of the dot has one activation and one weight scale.

A value is stored as saturate(x / scale) in e4m3 and read as stored * scale. ``fp8_linear_ref`` is
the CPU path and the oracle: it quantizes the activations, multiplies the FP8 values exactly (e4m3
products are exact in fp32), scales each block's fp32 dot and sums the blocks in K order, as the
GPU kernels do. On a GPU ``fp8_linear`` picks: per-channel W8A8 through ``torch._scaled_mm`` (bf16
out, sm_89+), block W8A8 through ``fp8_block_gemm_triton`` (sm_89+), otherwise weight-only (the
weights dequantized to the activations' dtype, then a plain GEMM: the memory saving without the
speed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._utils import HAS_TRITON, _INTERPRETED, check, require_triton, tl, triton

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# An all-zero row or block would get scale 0 and divide 0 by 0: its scale is this instead (its values
# stay 0 either way).
MIN_SCALE = 1e-12


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [R, K] -> [R, ceil(K / group), group], zero-padded on the right."""
    pad = -x.shape[-1] % group
    return F.pad(x, (0, pad)).view(x.shape[0], -1, group)


def quantize_rows_ref(x: torch.Tensor, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] -> (e4m3 [R, K], fp32 scales): one scale per row ([R, 1]) or, with ``group``, one per row
    per ``group`` columns ([R, ceil(K / group)]); scale = max|x| / 448 over what it covers."""
    xf = x.float()
    if group is None:
        scale = (xf.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_(min=MIN_SCALE)
        return (xf / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale
    g = _groups(xf, group)
    scale = (g.abs().amax(-1) / FP8_MAX).clamp_(min=MIN_SCALE)
    q = (g / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).flatten(1)[:, :x.shape[-1]]
    return q.to(FP8), scale


def quantize_weight(w: torch.Tensor, block: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [N, K] -> (e4m3 [N, K], fp32 scales [N] per output channel, or [ceil(N / bn), ceil(K / bk)]
    per ``block`` = (bn, bk) tile)."""
    if block is None:
        q, scale = quantize_rows_ref(w)
        return q, scale.squeeze(-1)
    bn, bk = block
    n, k = w.shape
    tiles = F.pad(w.float(), (0, -k % bk, 0, -n % bn)).view(-(-n // bn), bn, -(-k // bk), bk)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_(min=MIN_SCALE)
    q = (tiles / scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).view(tiles.shape[0] * bn, -1)[:n, :k]
    return q.to(FP8), scale


def weight_scale_rows(w_scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int] | None) -> torch.Tensor:
    """The weight's scales as a full [N, K] (block) or [N, 1] (per channel) fp32 tensor."""
    if block is None:
        return w_scale.float().view(-1, 1)
    n, k = shape
    return w_scale.float().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]


def dequantize_weight(w: torch.Tensor, w_scale: torch.Tensor, block: tuple[int, int] | None,
                      dtype: torch.dtype) -> torch.Tensor:
    """The weight the FP8 one stands for, in ``dtype``: stored * scale."""
    return (w.float() * weight_scale_rows(w_scale, tuple(w.shape), block)).to(dtype)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b.t()


def fp8_linear_ref(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
                   block: tuple[int, int] | None = None, matmul=_matmul) -> torch.Tensor:
    """y = x @ W^T (+ bias) with W = w * w_scale in e4m3 and x quantized per token (per token and block
    column with ``block``); fp32 dots of the FP8 values, each block's scaled and summed in K order,
    then cast to x's dtype and the bias added. ``matmul(a, b)`` = a @ b^T on fp32 (batch_invariant
    passes its fixed-row-tile one)."""
    rows = x.reshape(-1, x.shape[-1])
    if block is None:
        xq, xs = quantize_rows_ref(rows)
        out = matmul(xq.float(), w.float()) * xs * w_scale.float().view(1, -1)
    else:
        bn, bk = block
        xq, xs = quantize_rows_ref(rows, bk)
        ws = w_scale.float().repeat_interleave(bn, 0)[:w.shape[0]]  # [N, ceil(K / bk)]
        out = torch.zeros(rows.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
        for j in range(xs.shape[1]):
            cols = slice(j * bk, (j + 1) * bk)
            out += matmul(xq[:, cols].float(), w[:, cols].float()) * xs[:, j:j + 1] * ws[:, j].view(1, -1)
    out = out.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], w.shape[0])


# --- Triton: block-scaled W8A8 --------------------------------------------------------------------
@triton.jit
def _fp8_block_gemm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                           stride_asm, stride_bsn, GROUP_N: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program per BLOCK_M x BLOCK_N output tile; BLOCK_K is the scale block's width, so each step of
    # the K loop has one activation scale per row and one weight scale per column.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k = kb * BLOCK_K + offs_k
        k_ok = k < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptr + offs_n[None, :] * stride_bn + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        a_s = tl.load(as_ptr + offs_m * stride_asm + kb, mask=m_ok, other=0.0)
        b_s = tl.load(bs_ptr + (offs_n // GROUP_N) * stride_bsn + kb, mask=n_ok, other=0.0)
        if _INTERPRETED:  # the interpreter multiplies FP8/bf16 dots wrongly; fp32 operands are exact here
            d = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        elif a.dtype == tl.float32:
            d = tl.dot(a, b, input_precision="ieee")
        else:
            d = tl.dot(a, b)  # FP8 (or fp16) tensor cores, fp32 accumulation
        acc += d * a_s[:, None] * b_s[None, :]
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def fp8_block_gemm_triton(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                          block: tuple[int, int], out_dtype: torch.dtype) -> torch.Tensor:
    """a [M, K] x b [N, K]^T with a_scale [M, ceil(K / bk)] and b_scale [ceil(N / bn), ceil(K / bk)] fp32
    -> [M, N] in ``out_dtype``: fp8_linear_ref's block case without its quantization and bias. a and b
    in one dtype: e4m3 (a GPU), or fp32 / fp16 holding FP8 values (the interpreter's tests)."""
    require_triton()
    bn, bk = block
    check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1], f"a {tuple(a.shape)} and b {tuple(b.shape)} "
          "must be [M, K] and [N, K]")
    check(a.dtype == b.dtype and a.dtype in (FP8, torch.float16, torch.float32),
          f"a and b must share a dtype of e4m3, fp16 or fp32, got {a.dtype} and {b.dtype}")
    check(a.stride(1) == 1 and b.stride(1) == 1, "a and b need a contiguous last dim")
    check(bk >= 16 and bk & (bk - 1) == 0 and bn >= 1, f"block {block}: its K width must be a power of two >= 16")
    M, K = a.shape
    N = b.shape[0]
    kb = -(-K // bk)
    check(a_scale.dtype == b_scale.dtype == torch.float32, "scales must be fp32")
    check(tuple(a_scale.shape) == (M, kb) and tuple(b_scale.shape) == (-(-N // bn), kb),
          f"scales {tuple(a_scale.shape)} / {tuple(b_scale.shape)} do not match [M, {kb}] / [{-(-N // bn)}, {kb}]")
    check(a_scale.stride(1) == 1 and b_scale.stride(1) == 1, "scales need a contiguous last dim")
    out = torch.empty(M, N, dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return out
    block_m = 16 if M <= 16 else 64
    block_n = 64 if N <= 64 else 128
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _fp8_block_gemm_kernel[grid](a, b, out, a_scale, b_scale, M, N, K, a.stride(0), b.stride(0), out.stride(0),
                                 a_scale.stride(0), b_scale.stride(0), GROUP_N=bn, BLOCK_M=block_m,
                                 BLOCK_N=block_n, BLOCK_K=bk, num_warps=4)
    return out


# --- dispatch -------------------------------------------------------------------------------------
def has_fp8_tensor_cores(device: torch.device) -> bool:
    """sm_89 (Ada) and later: FP8 tensor cores, where W8A8 pays."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def gemm_path(device: torch.device, dtype: torch.dtype, block, n: int, k: int) -> str:
    """Which GEMM ``fp8_linear`` runs: "reference" (CPU), "scaled_mm", "triton_block" or "weight_only"."""
    if device.type != "cuda":
        return "reference"
    if not has_fp8_tensor_cores(device):
        return "weight_only"
    if block is not None:
        return "triton_block" if HAS_TRITON and block[1] >= 16 and block[1] & (block[1] - 1) == 0 else "weight_only"
    # _scaled_mm's row-wise scales take a bf16 output and dimensions that are multiples of 16
    return "scaled_mm" if dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0 else "weight_only"


def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
               block: tuple[int, int] | None = None, invariant: bool = False) -> torch.Tensor:
    """The FP8 linear layer on x's device (module docstring); ``invariant``: each row's result does not
    depend on the batch (LLM(batch_invariant=True): the reference in fixed row tiles)."""
    check(w.dtype == FP8, f"w must be float8_e4m3fn, got {w.dtype}")
    check(x.shape[-1] == w.shape[1], f"x has {x.shape[-1]} features, w takes {w.shape[1]}")
    if invariant:
        from .batch_invariant import linear_invariant
        return fp8_linear_ref(x, w, w_scale, bias, block, matmul=linear_invariant)
    path = gemm_path(x.device, x.dtype, block, *w.shape)
    if path == "reference":
        return fp8_linear_ref(x, w, w_scale, bias, block)
    if path == "weight_only":
        return F.linear(x, dequantize_weight(w, w_scale, block, x.dtype), bias)
    rows = x.reshape(-1, x.shape[-1])
    if path == "scaled_mm":
        xq, xs = quantize_rows_ref(rows)
        out = torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=w_scale.float().view(1, -1), out_dtype=x.dtype)
    else:
        xq, xs = quantize_rows_ref(rows, block[1])
        out = fp8_block_gemm_triton(xq, xs, w, w_scale, block, x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], w.shape[0])


if not HAS_TRITON:  # only the reference is offered where triton does not import
    del fp8_block_gemm_triton
