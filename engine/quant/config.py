"""Which weight format a model runs in: ``quantization`` as asked (vLLM's ``--quantization fp8``) and the
checkpoint's ``quantization_config``, checked without torch.

Supported: FP8 e4m3 with dynamic (per-token) activation scales, vLLM's ``fp8`` method:

- from a bf16/fp16/fp32 checkpoint, ``quantization="fp8"`` quantizes the attention and MLP projections
  at load with one scale per output channel;
- a pre-quantized checkpoint (``quant_method: fp8``) is read as it is: e4m3 weights with 128 x 128 block
  scales (``weight_block_size``, tensors ``*.weight_scale_inv``, as the official Qwen3-8B-FP8), or
  per-tensor / per-channel scales (``*.weight_scale``) without ``weight_block_size``;
- a compressed-tensors FP8-dynamic checkpoint (``quant_method: compressed-tensors``, llm-compressor's
  releases) likewise: per-channel ``*.weight_scale`` [out, 1], per-token activations
  (engine/quant/compressed_tensors.py).

The modules a checkpoint names as left unquantized (``ignored_layers``, vLLM's; ``modules_to_not_convert``,
transformers'; ``ignore``, compressed-tensors') stay in the model's dtype.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.quant.compressed_tensors import compressed_tensors_ignore

QUANTIZATIONS = ("fp8",)  # vLLM's names
WAY_OUT = ("load the unquantized (bf16) model instead, with quantization='fp8' (--quantization fp8) to "
            "quantize it at load")


@dataclass(slots=True, frozen=True)
class Fp8Config:
    """FP8 e4m3 projections. block: (rows, columns) of a scale's tile (a pre-quantized checkpoint's
    ``weight_block_size``); None: one scale per output channel. prequantized: the checkpoint stores e4m3
    weights and their scales (else they are quantized at load)."""

    block: tuple[int, int] | None = None
    prequantized: bool = False
    ignore: tuple[str, ...] = ()  # modules the checkpoint left unquantized (HF names; "re:" for a regex)
    method: str = "fp8"  # the checkpoint's quant_method

    def describe(self) -> str:
        scales = f"{self.block[0]}x{self.block[1]} block scales" if self.block else "per-channel scales"
        source = f"from the {self.method} checkpoint" if self.method != "fp8" else "from the checkpoint"
        return f"fp8_e4m3 ({scales}, {source if self.prequantized else 'quantized at load'})"

    def quantizes(self, module: str) -> bool:
        """Whether the Hugging Face module ``module`` (e.g. model.layers.3.mlp.down_proj) is FP8: not when an
        ignore entry names it: the whole name, a dotted suffix of it (``lm_head``, ``down_proj``), or
        ``re:PATTERN`` matching from its start, as compressed-tensors matches."""
        for entry in self.ignore:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return False
            elif module == entry or module.endswith("." + entry) or module.startswith(entry + "."):
                return False
        return True


def checkpoint_quantization(raw: dict, where) -> Fp8Config | None:
    """The ``quantization_config`` of a config.json (``raw``), or None; ValueError naming the key and the
    way out for what this engine does not run."""
    qc = raw.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"{where}: quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method == "compressed-tensors":
        ignore = _patterns_compile(compressed_tensors_ignore(qc, where, WAY_OUT), where)
        return Fp8Config(prequantized=True, ignore=ignore, method=method)
    if method != "fp8":
        raise ValueError(f"{where}: quantization_config.quant_method {method!r} is not supported: this engine runs "
                         f"FP8 checkpoints (quant_method 'fp8', e4m3, dynamic activation scales, as Qwen3-8B-FP8, or "
                         f"'compressed-tensors' FP8-dynamic); "
                         f"{WAY_OUT}")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"{where}: quantization_config.fmt {fmt!r} is not supported (only e4m3); {WAY_OUT}")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(f"{where}: quantization_config.activation_scheme {scheme!r} is not supported: activations "
                         f"are quantized per token at run time ('dynamic'), static input scales are not read; {WAY_OUT}")
    block = qc.get("weight_block_size")
    if block is not None:
        if (not isinstance(block, (list, tuple)) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)):
            raise ValueError(f"{where}: quantization_config.weight_block_size must be two positive integers such "
                             f"as [128, 128], got {block!r}")
        if block[1] < 16 or block[1] & (block[1] - 1):
            raise ValueError(f"{where}: quantization_config.weight_block_size {list(block)}: the column width must be "
                             f"a power of two >= 16 (128 in published checkpoints); {WAY_OUT}")
        block = (int(block[0]), int(block[1]))
    ignore = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise ValueError(f"{where}: quantization_config ignored_layers / modules_to_not_convert must be a list of "
                         f"module names, got {ignore!r}")
    return Fp8Config(block=block, prequantized=True, ignore=_patterns_compile(tuple(ignore), where))


def _patterns_compile(ignore: tuple[str, ...], where) -> tuple[str, ...]:
    """``ignore``, its "re:" entries checked to compile (Fp8Config.quantizes matches them as the model is built)."""
    for entry in ignore:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except (re.error, RecursionError, OverflowError) as e:
                raise ValueError(f"{where}: quantization_config ignore entry {entry!r} is not a regular expression "
                                 f"({e}); fix it (e.g. 're:.*lm_head') or name the module itself") from None
    return ignore


def resolve_quantization(asked: str | None, checkpoint: Fp8Config | None, where) -> Fp8Config | None:
    """The format to run: a pre-quantized checkpoint's own (asked or not, as vLLM), else ``asked``'s."""
    if asked is not None and asked not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)} or None, got {asked!r}")
    if checkpoint is not None:
        return checkpoint
    return Fp8Config() if asked == "fp8" else None
