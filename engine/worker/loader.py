"""Load Hugging Face safetensors (single file or sharded) into the fused decoder, or one rank's slice of it."""
from __future__ import annotations

import logging
import re

import torch
from safetensors import SafetensorError, safe_open

from engine.worker.checkpoint_checks import check_checkpoint, checkpoint_files
from engine.parallel.distributed import Shard, TPGroup
from engine.worker.model import CausalLM
from engine.quant.fp8 import SCALE_NAMES, Fp8Linear, load_scale, load_weight

# HF name -> (our parameter, shard index into a fused parameter or None)
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
# An FP8-KV checkpoint's per-layer cache scales, as vLLM reads them: self_attn.k_scale / v_scale (vLLM,
# AutoFP8, llm-compressor), the older single self_attn.kv_scale (both), and compressed-tensors'
# k_proj.output_scale / v_proj.output_scale. q_scale / prob_scale quantize q and the softmax, which
# this engine keeps in the model's dtype: ignored.
_KV_SCALE = re.compile(r"(?:model\.)?layers\.(\d+)\.self_attn\.(k_scale|v_scale|kv_scale|k_proj\.output_scale|"
                       r"v_proj\.output_scale|q_scale|prob_scale|q_proj\.output_scale)$")
# name -> the scales it sets, and its precedence when a layer names a scale twice (lower wins): the
# per-K/V names over the older single kv_scale, which sets both.
_KV_SCALE_TARGETS = {"k_scale": (("k_scale",), 0), "v_scale": (("v_scale",), 0),
                     "k_proj.output_scale": (("k_scale",), 1), "v_proj.output_scale": (("v_scale",), 1),
                     "kv_scale": (("k_scale", "v_scale"), 2)}
# A scale maps the FP8 range onto the layer's K or V (~max|K| / 448, so ~1e-3 to 10 in practice): far
# outside this range a scale is corrupt, and would store every value as 0 or as the format's largest.
KV_SCALE_RANGE = (1e-6, 1e6)
log = logging.getLogger("engine")


def _open(file):
    """safe_open, what it refuses beyond check_checkpoint's header checks said in one line."""
    try:
        return safe_open(str(file), framework="pt")
    except SafetensorError as e:
        raise ValueError(f"{file}: not a whole safetensors file ({e}); re-download or re-save it") from None


def _part(shard: Shard, cfg, module: str, shape: tuple) -> tuple[int, int, int] | None:
    """(dim, start, end) of this rank's slice of a checkpoint tensor; None for the whole tensor."""
    if shard.size == 1:
        return None
    d = cfg.head_dim
    if module == "q_proj":
        return 0, shard.heads[0] * d, shard.heads[1] * d
    if module in ("k_proj", "v_proj"):
        return 0, shard.kv_heads[0] * d, shard.kv_heads[1] * d
    if module in ("gate_proj", "up_proj"):
        return 0, *shard.ffn
    if module in ("o_proj", "down_proj") and len(shape) == 2:  # row-parallel weight: input columns
        cols = shard.heads if module == "o_proj" else shard.ffn
        unit = d if module == "o_proj" else 1
        return 1, cols[0] * unit, cols[1] * unit
    if module in ("embed_tokens", "lm_head"):
        return 0, min(shard.vocab[0], shape[0]), min(shard.vocab[1], shape[0])  # the padding is not stored
    return None


def _read(f, hf_name: str, part) -> torch.Tensor:
    if part is None:
        return f.get_tensor(hf_name)
    dim, a, b = part
    view = f.get_slice(hf_name)  # reads only this rank's rows or columns from disk
    return view[a:b] if dim == 0 else view[:, a:b]


def load_weights(model: CausalLM, path, kv_scales: bool = False) -> None:
    """Load the checkpoint in ``path`` into ``model``; ``kv_scales``: read its FP8 cache scales (an
    FP8 cache; otherwise they are unused, so neither read nor checked)."""
    cfg, shard = model.cfg, model.shard
    scales: list[tuple[int, str, float]] = []  # the FP8 cache scales read: (layer, name, value)
    params = dict(model.named_parameters(remove_duplicate=False))
    q, kv, ffn = shard.num_heads * cfg.head_dim, shard.num_kv_heads * cfg.head_dim, shard.ffn_size
    fused_sizes = {"qkv_proj": [q, kv, kv], "gate_up_proj": [ffn, ffn]}
    fp8 = {name: m for name, m in model.named_modules() if isinstance(m, Fp8Linear)}
    loaded: set[str] = set()
    for file in checkpoint_files(path):
        with _open(file) as f:
            for hf_name in f.keys():
                if _IGNORED.match(hf_name):
                    continue
                if (m := _KV_SCALE.match(hf_name)) is not None:
                    if kv_scales and m.group(2) in _KV_SCALE_TARGETS:
                        layer, kind = int(m.group(1)), m.group(2)
                        scales.append((layer, kind, _kv_scale(model, file, hf_name, f.get_tensor(hf_name), layer)))
                    continue
                name = hf_name.removeprefix("model.")
                parts = name.split(".")
                module = parts[-2] if len(parts) >= 2 else ""
                shard_idx = None
                if module in _FUSED:
                    fused, shard_idx = _FUSED[module]
                    name = ".".join(parts[:-2] + [fused, parts[-1]])
                owner = name.rpartition(".")[0]
                if owner in fp8 and parts[-1] in ("weight", *SCALE_NAMES):
                    loaded |= _load_fp8(fp8[owner], f, file, hf_name, owner, parts[-1], shard_idx,
                                        fused_sizes.get(owner.rpartition(".")[2]), _part(shard, cfg, module, (0, 0)))
                    continue
                if parts[-1] in SCALE_NAMES or f.get_slice(hf_name).get_dtype().startswith("F8"):
                    raise ValueError(f"{file.name}: {hf_name!r} is FP8 (or its scale), but this engine runs only the "
                                     "attention and MLP projections in FP8 and keeps embeddings, norms and the LM head "
                                     "in the model's dtype; dequantize it in the checkpoint")
                if name not in params:
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue  # some tied checkpoints still store the head
                    raise ValueError(f"{file.name}: unexpected tensor {hf_name!r} for {cfg.architecture}; "
                                     "the checkpoint does not match its config.json")
                target = params[name].data
                if shard_idx is not None:
                    sizes = fused_sizes[name.split(".")[-2]]
                    target = target.narrow(0, sum(sizes[:shard_idx]), sizes[shard_idx])
                    loaded.add(f"{name}#{shard_idx}")
                else:
                    loaded.add(name)
                if module in ("o_proj", "down_proj") and parts[-1] == "bias" and shard.rank > 0:
                    target.zero_()  # a row-parallel bias is added once: by rank 0, before the all-reduce
                    continue
                full_shape = tuple(f.get_slice(hf_name).get_shape())
                if module in ("embed_tokens", "lm_head"):
                    if full_shape != (cfg.vocab_size, cfg.hidden_size):
                        _bad_shape(file, hf_name, full_shape, (cfg.vocab_size, cfg.hidden_size))
                    rows = max(0, min(shard.vocab[1], cfg.vocab_size) - shard.vocab[0])
                    target[rows:].zero_()  # the last rank's vocabulary padding
                    target = target[:rows]
                tensor = _read(f, hf_name, _part(shard, cfg, module, full_shape))
                if target.shape != tensor.shape:
                    _bad_shape(file, hf_name, full_shape, tuple(target.shape), shard.size)
                target.copy_(tensor.to(target.dtype))
    expected = set()
    for name in params:
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base = name.split(".")[-2] if "." in name else ""
        if base in fused_sizes:
            expected |= {f"{name}#{i}" for i in range(len(fused_sizes[base]))}
        else:
            expected.add(name)
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint in {path} lacks {len(missing)} tensors, e.g. {missing[:4]}")
    _set_kv_scales(model, scales)


def _load_fp8(layer: Fp8Linear, f, file, hf_name: str, owner: str, kind: str, shard_idx, sizes, part) -> set[str]:
    """One checkpoint tensor of an FP8 projection (engine/quant/fp8.py): its weight, quantized on the device
    unless stored in FP8, or its scales; returns the names it loaded, as load_weights counts them."""
    rows = None if shard_idx is None else (sum(sizes[:shard_idx]), sizes[shard_idx])
    tag = "" if shard_idx is None else f"#{shard_idx}"
    what = f"{file.name}: {hf_name!r}"
    if kind == "weight":
        set_scales = load_weight(layer, _read(f, hf_name, part), rows, what)
        return {f"{owner}.weight{tag}"} | ({f"{owner}.weight_scale{tag}"} if set_scales else set())
    if (kind == "weight_scale_inv") != (layer.block is not None):
        raise ValueError(f"{what} does not match the checkpoint's quantization_config ("
                         f"{'block scales are *.weight_scale_inv' if layer.block else 'no weight_block_size, so *.weight_scale'})")
    load_scale(layer, f.get_tensor(hf_name), rows, part, what)
    return {f"{owner}.weight_scale{tag}"}


def _kv_scale(model: CausalLM, file, hf_name: str, tensor: torch.Tensor, layer: int) -> float:
    """A checkpoint's FP8 cache scale, checked: per-tensor (vLLM's default) and in KV_SCALE_RANGE."""
    way_out = "; or serve with --kv-cache-dtype auto, which does not use the checkpoint's KV scales"
    if layer >= len(model.layers):
        raise ValueError(f"{file.name}: {hf_name!r} names layer {layer}, the model has {len(model.layers)}")
    if tensor.numel() != 1:
        raise ValueError(f"{file.name}: {hf_name!r} has shape {tuple(tensor.shape)}; only per-tensor (scalar) KV "
                         f"cache scales are supported, not per-head ones{way_out}")
    value = float(tensor.float().item())
    low, high = KV_SCALE_RANGE
    if not low <= value <= high:
        raise ValueError(f"{file.name}: {hf_name!r} is {value}; a KV cache scale must be in [{low:g}, {high:g}] "
                         f"(an FP8 checkpoint's are near max|K| / 448), so this checkpoint's is corrupt{way_out}")
    return value


def _set_kv_scales(model: CausalLM, scales: list[tuple[int, str, float]]) -> None:
    """Set each layer's K and V scales; a layer that names one twice gets the name of higher
    precedence (_KV_SCALE_TARGETS), said once."""
    best: dict[tuple[int, str], tuple[int, str, float]] = {}
    clash = None
    for layer, kind, value in scales:
        targets, precedence = _KV_SCALE_TARGETS[kind]
        for target in targets:
            held = best.get((layer, target))
            if held is not None and held[1] != kind:
                clash = clash or (layer, *sorted([held[1], kind], key=lambda k: _KV_SCALE_TARGETS[k][1]))
            if held is None or precedence < held[0]:
                best[(layer, target)] = (precedence, kind, value)
    if clash is not None:  # once: such a checkpoint usually names every layer's twice
        layer, used, ignored = clash
        log.warning("the checkpoint names a KV cache scale twice (layer %d: self_attn.%s and self_attn.%s): "
                    "using self_attn.%s, the more specific name, over self_attn.%s, in every layer",
                    layer, used, ignored, used, ignored)
    for (layer, target), (_, _, value) in best.items():
        setattr(model.layers[layer].self_attn, target, value)


def _bad_shape(file, hf_name: str, shape: tuple, implied: tuple, ranks: int = 1):
    per_rank = f" for each of {ranks} tensor-parallel ranks" if ranks > 1 else ""
    raise ValueError(f"{file.name}: {hf_name!r} has shape {shape}, config.json implies {implied}{per_rank}")


@torch.no_grad()
def load_model(cfg, dtype: torch.dtype, device: torch.device, shard: Shard | None = None,
               tp: TPGroup | None = None, kv_scales: bool = False) -> CausalLM:
    """Build the model (this rank's shard of it under tensor parallelism) and load its weights;
    ``kv_scales``: the KV cache is FP8, so the checkpoint's cache scales are read (else each is 1.0)."""
    check_checkpoint(cfg)  # its headers and sizes, before config.json's sizes are allocated
    with torch.device("meta"):
        model = CausalLM(cfg, shard, tp)
    # Cast on meta (free), then allocate: the device holds the weights once, in their dtype. (Allocating
    # fp32 and casting peaked at ~2x the weights, and left that in torch's cache.)
    model = model.to(dtype)
    for m in model.modules():
        if isinstance(m, Fp8Linear):
            m.restore_formats()  # FP8 weights and fp32 scales stay so: .to(dtype) cast them too
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load_weights(model, cfg.path, kv_scales)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # what loading left cached counts as used in the KV cache's sizing
    return model.eval()


def load_tokenizer(path):
    """The tokenizer in ``path``; ValueError names the fix when there is none."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"no tokenizer could be loaded from {path} ({e}); pass tokenizer=FOLDER with "
                         "tokenizer files, or skip_tokenizer_init=True to work with token ids only") from None
