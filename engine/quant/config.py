"""Which weight format a model runs in: ``quantization`` as asked (vLLM's ``--quantization fp8``) and the
checkpoint's ``quantization_config``, checked without torch.

Supported: FP8 e4m3 with dynamic (per-token) activation scales, vLLM's ``fp8`` method:

- from a bf16/fp16/fp32 checkpoint, ``quantization="fp8"`` quantizes the attention and MLP projections
  at load with one scale per output channel;
- a pre-quantized checkpoint (``quant_method: fp8``) is read as it is: e4m3 weights with 128 x 128 block
  scales (``weight_block_size``, tensors ``*.weight_scale_inv``, as the official Qwen3-8B-FP8), or
  per-tensor / per-channel scales (``*.weight_scale``) without ``weight_block_size``.
"""
from __future__ import annotations

from dataclasses import dataclass

QUANTIZATIONS = ("fp8",)  # vLLM's names
_WAY_OUT = ("load the unquantized (bf16) model instead, with quantization='fp8' (--quantization fp8) to "
            "quantize it at load")


@dataclass(slots=True, frozen=True)
class Fp8Config:
    """FP8 e4m3 projections. block: (rows, columns) of a scale's tile (a pre-quantized checkpoint's
    ``weight_block_size``); None: one scale per output channel. prequantized: the checkpoint stores e4m3
    weights and their scales (else they are quantized at load)."""

    block: tuple[int, int] | None = None
    prequantized: bool = False

    def describe(self) -> str:
        scales = f"{self.block[0]}x{self.block[1]} block scales" if self.block else "per-channel scales"
        return f"fp8_e4m3 ({scales}, {'from the checkpoint' if self.prequantized else 'quantized at load'})"


def checkpoint_quantization(raw: dict, where) -> Fp8Config | None:
    """The ``quantization_config`` of a config.json (``raw``), or None; ValueError naming the key and the
    way out for what this engine does not run."""
    qc = raw.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"{where}: quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method != "fp8":
        raise ValueError(f"{where}: quantization_config.quant_method {method!r} is not supported: this engine runs "
                         f"FP8 checkpoints (quant_method 'fp8', e4m3, dynamic activation scales, as Qwen3-8B-FP8); "
                         f"{_WAY_OUT}")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"{where}: quantization_config.fmt {fmt!r} is not supported (only e4m3); {_WAY_OUT}")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(f"{where}: quantization_config.activation_scheme {scheme!r} is not supported: activations "
                         f"are quantized per token at run time ('dynamic'), static input scales are not read; {_WAY_OUT}")
    block = qc.get("weight_block_size")
    if block is not None:
        if (not isinstance(block, (list, tuple)) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)):
            raise ValueError(f"{where}: quantization_config.weight_block_size must be two positive integers such "
                             f"as [128, 128], got {block!r}")
        if block[1] < 16 or block[1] & (block[1] - 1):
            raise ValueError(f"{where}: quantization_config.weight_block_size {list(block)}: the column width must be "
                             f"a power of two >= 16 (128 in published checkpoints); {_WAY_OUT}")
        block = (int(block[0]), int(block[1]))
    return Fp8Config(block=block, prequantized=True)


def resolve_quantization(asked: str | None, checkpoint: Fp8Config | None, where) -> Fp8Config | None:
    """The format to run: a pre-quantized checkpoint's own (asked or not, as vLLM), else ``asked``'s."""
    if asked is not None and asked not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)} or None, got {asked!r}")
    if checkpoint is not None:
        return checkpoint
    return Fp8Config() if asked == "fp8" else None
