"""Fp8Linear: an attention or MLP projection in FP8 e4m3 with fp32 scales, and how its tensors load.

Only the projections (q|k|v, o, gate|up, down) are FP8: they are ~90% of an 8B model's bytes and each
decode step reads all of them. Embeddings are gathered a row per token (their bytes are not read per
step), norms are a few KB, and the LM head decides every sampled token, so all stay in the model's
dtype (as vLLM's fp8 and Qwen3-8B-FP8 keep them).

Loading holds one bf16 projection on the device at a time beside the FP8 model: each checkpoint tensor
is read, moved to the device, quantized into its slot and dropped (engine/worker/loader.py).
"""
from __future__ import annotations

import torch
from torch import nn

from engine.quant.config import Fp8Config
from pacore_kernels.fp8_gemm import FP8, fp8_linear, quantize_weight

SCALE_NAMES = ("weight_scale", "weight_scale_inv")  # per-tensor/channel; blocks (Qwen3-8B-FP8's name)


class Fp8Linear(nn.Module):
    """y = x W^T + b with W stored as e4m3 ``weight`` [out, in] times fp32 ``weight_scale`` ([out], or
    [ceil(out / bn), ceil(in / bk)] for block scales); activations quantized per token at run time."""

    def __init__(self, in_features: int, out_features: int, bias: bool, quant: Fp8Config):
        super().__init__()
        self.in_features, self.out_features, self.block = in_features, out_features, quant.block
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(self.scale_shape(out_features, in_features), dtype=torch.float32),
                                         requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.invariant = False  # LLM(batch_invariant=True): fixed row tiles (engine/worker/model.py tile_linears)

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        if self.block is None:
            return (rows,)
        return (-(-rows // self.block[0]), -(-cols // self.block[1]))

    def restore_formats(self) -> None:
        """Back to e4m3 / fp32 after ``model.to(dtype)`` cast every float parameter (on meta: free)."""
        self.weight.data = self.weight.data.to(FP8)
        self.weight_scale.data = self.weight_scale.data.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale, self.bias, self.block, self.invariant)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, block={self.block}"


def _scale_rows(layer: Fp8Linear, rows: tuple[int, int] | None, what: str) -> torch.Tensor:
    """The scales of weight rows (start, size) of a fused layer (all of them for None)."""
    scale = layer.weight_scale.data
    if rows is None:
        return scale
    start, size = rows
    if layer.block is None:
        return scale.narrow(0, start, size)
    bn = layer.block[0]
    if start % bn or size % bn:
        raise ValueError(f"{what}: its rows {start}..{start + size} of the fused projection do not fall on the "
                         f"{layer.block[0]}x{layer.block[1]} scale blocks; this engine fuses q|k|v and gate|up, "
                         f"so each part must be a multiple of {bn} rows (per rank under tensor parallelism)")
    return scale.narrow(0, start // bn, size // bn)


def load_weight(layer: Fp8Linear, tensor: torch.Tensor, rows: tuple[int, int] | None, what: str) -> bool:
    """Put a checkpoint weight (this rank's part) into ``layer``'s rows: e4m3 as stored, or quantized on
    the device from bf16/fp16/fp32 (its scales with it). True when it set the scales too."""
    target = layer.weight.data if rows is None else layer.weight.data.narrow(0, *rows)
    if tuple(target.shape) != tuple(tensor.shape):
        raise ValueError(f"{what} has shape {tuple(tensor.shape)}, config.json implies {tuple(target.shape)}")
    if tensor.dtype == FP8:
        target.copy_(tensor)
        return False
    if tensor.element_size() == 1:
        raise ValueError(f"{what} is {tensor.dtype}: only float8_e4m3fn FP8 weights are supported")
    q, scale = quantize_weight(tensor.to(target.device), layer.block)
    target.copy_(q)
    _scale_rows(layer, rows, what).copy_(scale)
    return True


def load_scale(layer: Fp8Linear, tensor: torch.Tensor, rows: tuple[int, int] | None, part, what: str) -> None:
    """Put a checkpoint's scale into ``layer``: per-tensor (one value), per-channel ([out] or [out, 1])
    or block ([ceil(out / bn), ceil(in / bk)]); ``part`` is this rank's (dim, start, end) of the weight."""
    tensor = tensor.float()
    target = _scale_rows(layer, rows, what)
    if layer.block is None:
        tensor = tensor.reshape(-1)
        if tensor.numel() == 1:
            target.fill_(tensor.item())
            return
        if part is not None and part[0] == 0:
            tensor = tensor[part[1]:part[2]]
    else:
        if tensor.dim() != 2:
            raise ValueError(f"{what} has shape {tuple(tensor.shape)}: block scales are 2-D "
                             f"[ceil(out / {layer.block[0]}), ceil(in / {layer.block[1]})]")
        if part is not None:
            dim, a, b = part
            unit = layer.block[dim]
            full = tensor.shape[dim] * unit
            if a % unit or (b % unit and b < full - unit + 1):
                raise ValueError(f"{what}: this rank's slice {a}..{b} of dim {dim} does not fall on the checkpoint's "
                                 f"{layer.block[0]}x{layer.block[1]} scale blocks; use a tensor_parallel_size whose "
                                 f"slices are multiples of {unit}, or quantize the bf16 model at load "
                                 f"(quantization='fp8')")
            tensor = tensor.narrow(dim, a // unit, -(-b // unit) - a // unit)
    if tuple(target.shape) != tuple(tensor.shape):
        raise ValueError(f"{what} has shape {tuple(tensor.shape)} for this rank, the layer's scales are "
                         f"{tuple(target.shape)}")
    target.copy_(tensor)


def weight_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of the FP8 projections and their scales, bytes of every other weight), tied ones once."""
    fp8 = other = 0
    for p in model.parameters():  # remove_duplicate: a tied LM head is the embedding
        n = p.numel() * p.element_size()
        if p.dtype == FP8:
            fp8 += n
        else:
            other += n
    scales = sum(m.weight_scale.numel() * 4 for m in model.modules() if isinstance(m, Fp8Linear))
    return fp8 + scales, other - scales


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


# The Hugging Face names of a layer's projections, in ModelShape.layer_projections' order.
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


def describe_weights(cfg, dtype: torch.dtype) -> str:
    """The startup line's weights: their format and bytes (every rank's together), from the shapes the
    model is built with (engine/core/step_shape.py; biases aside); with FP8, which projections are FP8 (those a
    checkpoint's ignore list leaves out stay in the dtype, as engine/worker/model.py builds them)."""
    from engine.core.step_shape import ModelShape
    shape = ModelShape.from_config(cfg, dtype.itemsize)
    name = str(dtype).removeprefix("torch.")
    lm_head = 0 if cfg.tie_word_embeddings else shape.lm_head_params * dtype.itemsize
    if cfg.quant is None:
        return f"weights {name} {_size(shape.weight_bytes + lm_head)}"
    layers = cfg.num_layers
    fp8 = [[cfg.quant.quantizes(f"model.layers.{i}.{p}") for p in PROJECTIONS] for i in range(layers)]
    sizes = shape.layer_projections
    fp8_bytes = sum(shape.projection_bytes(n, k) for row in fp8 for (n, k), q in zip(sizes, row) if q)
    plain_bytes = sum(shape.projection_bytes(n, k, False) for row in fp8 for (n, k), q in zip(sizes, row) if not q)
    total = shape.weight_bytes - shape.linear_weight_bytes + fp8_bytes + plain_bytes + lm_head
    counts: dict[int, list[str]] = {}  # layers in which a projection is FP8 -> its short names (q, ..., down)
    for j, p in enumerate(PROJECTIONS):
        counts.setdefault(sum(row[j] for row in fp8), []).append(p.split(".")[1].removesuffix("_proj"))
    if set(counts) == {0}:
        return f"weights {name} {_size(total)} (the checkpoint's quantization_config leaves every projection unquantized)"
    which = ", ".join(f"{','.join(names)} in " + ("every layer" if n == layers else f"{n} of {layers} layers")
                      for n, names in sorted(counts.items(), reverse=True) if n)
    rest = "the other projections, " if plain_bytes else ""
    return (f"weights {_size(total)}: projections {cfg.quant.describe()} {_size(fp8_bytes)} for {which}; "
            f"{rest}embeddings, norms and LM head {name}")
