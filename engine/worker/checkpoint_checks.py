"""A model folder checked before anything is built from it: a hostile or damaged one is one ValueError that
names the file, the field and the fix, never a traceback from transformers, safetensors or torch's
allocator, and never a huge allocation.

- config.json / generation_config.json: JSON objects whose sizes are positive integers (not "8", 8.0,
  true or a list), eos ids token ids, RoPE parameters an object of numbers, max_position_embeddings at
  most MAX_POSITIONS (check_config, eos_token_ids);
- the safetensors files: inside the folder (an index's entries and symlinks alike; a Hugging Face hub
  snapshot's links into its own blobs/ are fine), headers whose length fits the file, float tensors
  only, and as many values as config.json's sizes imply, so an absurd vocab_size or num_hidden_layers
  is refused before the model is allocated (checkpoint_files, check_checkpoint);
- the context in use: its RoPE and block tables fit the memory there is (check_context_memory).
"""
from __future__ import annotations

import math
import os
import struct
from pathlib import Path

from engine.jsonfile import loads_json, read_json

# No released Llama/Qwen model declares more (Llama 4 Scout's 10M is the longest); beyond it the number is corrupt.
MAX_POSITIONS = 1 << 24
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on a header
# The dtypes the loader casts (FP8: engine/quant/), and their bytes per value.
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "max_position_embeddings", "num_key_value_heads", "head_dim")  # the last two may be null
_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias")
_ROPE_NUMBERS = ("rope_theta", "factor", "original_max_position_embeddings", "low_freq_factor",
                 "high_freq_factor", "attention_factor", "beta_fast", "beta_slow")
MAX_NUMBER = 1e12  # above any real RoPE base or factor; keeps their products (check_max_model_len) finite


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return (_is_int(x) or isinstance(x, float)) and math.isfinite(x)


def _positive_number(value, name: str, cfg_file: Path, fix: str) -> None:
    if value is not None and (not _is_number(value) or not 0 < value <= MAX_NUMBER):
        raise ValueError(f"{cfg_file}: {name} must be a positive number (at most {MAX_NUMBER:g}), got {value!r}{fix}")


def check_config(raw, cfg_file: Path) -> dict:
    """config.json's value ``raw`` checked where the engine reads it; returns it."""
    fix = "; fix it in config.json (as the model's original config.json has it)"
    if not isinstance(raw, dict):
        raise ValueError(f"{cfg_file}: must be a JSON object of the model's settings, got {type(raw).__name__}{fix}")
    for key in _SIZES:
        value = raw.get(key)
        if value is None and key in ("num_key_value_heads", "head_dim"):
            continue
        if key in raw and (not _is_int(value) or value < 1):
            raise ValueError(f"{cfg_file}: {key} must be a positive integer, got {value!r}{fix}")
    if raw.get("max_position_embeddings", 0) > MAX_POSITIONS:
        raise ValueError(f"{cfg_file}: max_position_embeddings {raw['max_position_embeddings']:,} is beyond any "
                         f"model's context (at most {MAX_POSITIONS:,} here){fix}")
    heads, kv_heads = raw.get("num_attention_heads"), raw.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise ValueError(f"{cfg_file}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{kv_heads}{fix}")
    _positive_number(raw.get("rms_norm_eps"), "rms_norm_eps", cfg_file, fix)
    _positive_number(raw.get("rope_theta"), "rope_theta", cfg_file, fix)  # older configs keep it at the top
    for key in _FLAGS:
        if raw.get(key) is not None and not isinstance(raw[key], bool):
            raise ValueError(f"{cfg_file}: {key} must be true or false, got {raw[key]!r}{fix}")
    archs = raw.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise ValueError(f"{cfg_file}: architectures must be a list of names such as [\"Qwen3ForCausalLM\"], got "
                         f"{archs!r}{fix}")
    for key in ("rope_parameters", "rope_scaling"):
        rope = raw.get(key)
        if rope is not None and not isinstance(rope, dict):
            raise ValueError(f"{cfg_file}: {key} must be an object such as {{\"rope_type\": \"default\", "
                             f"\"rope_theta\": 10000.0}} or null, got {rope!r}{fix}")
        for name in _ROPE_NUMBERS:
            _positive_number((rope or {}).get(name), f"{key}.{name}", cfg_file, fix)
    eos_token_ids(raw.get("eos_token_id"), cfg_file)
    return raw


def eos_token_ids(eos, where) -> list[int]:
    """An ``eos_token_id`` (a token id, a list of them, or null) as a list; ValueError naming ``where``."""
    ids = [eos] if _is_int(eos) else eos if isinstance(eos, list) else [] if eos is None else None
    if ids is None or not all(_is_int(i) and i >= 0 for i in ids):
        raise ValueError(f"{where}: eos_token_id must be a token id or a list of them, got {eos!r}; fix it there "
                         f"(the tokenizer's end-of-sequence token ids)")
    return ids


def generation_eos(gen_file: Path, default: list[int]) -> list[int]:
    """generation_config.json's eos_token_id (it wins over config.json's, as in transformers), or ``default``."""
    gen = read_json(gen_file)
    if not isinstance(gen, dict):
        raise ValueError(f"{gen_file}: must be a JSON object of generation settings, got {type(gen).__name__}; fix "
                         f"it, or remove it to use config.json's eos_token_id")
    return eos_token_ids(gen["eos_token_id"], gen_file) if "eos_token_id" in gen else default


def _inside(file: Path, folder: Path) -> bool:
    """Whether ``file`` resolves inside ``folder`` or, for a Hugging Face hub snapshot
    (models--org--name/snapshots/REV), inside its repository's folder (the links point to ../../blobs)."""
    real, root = Path(os.path.realpath(file)), Path(os.path.realpath(folder))
    roots = [root] + ([root.parent.parent] if root.parent.name == "snapshots" else [])
    return any(real.is_relative_to(r) for r in roots)


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of the folder ``path`` (its index's, else every *.safetensors), each inside it."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index}: must be a JSON object whose weight_map maps tensor names to file names; "
                             "re-save the model, or remove the index to load every *.safetensors in the folder")
        files = [path / n for n in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    outside = [str(f.relative_to(path)) for f in files if not _inside(f, path)]
    if outside:
        raise ValueError(f"{path}: {outside[:3]} resolve outside the model folder (a weight-map entry or a symbolic "
                         "link); refused: copy the weights into the folder")
    missing = [f for f in files if not f.is_file()]
    if not files or missing:
        raise FileNotFoundError(
            f"no complete safetensors checkpoint in {path} (missing: {missing or '*.safetensors'}); "
            "the engine loads Hugging Face folders saved with safe_serialization=True")
    return files


def read_header(file: Path) -> dict[str, tuple[str, list[int], int]]:
    """name -> (dtype, shape, bytes) of a safetensors file, from its header alone, checked against the file's size."""
    bad = f"{file}: not a whole safetensors file"
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{bad} ({size} bytes, shorter than its header's length); re-download or re-save it")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise ValueError(f"{bad} (its header claims {n:,} bytes, the file has {size:,}): truncated or damaged; "
                             "re-download or re-save it")
        try:
            header = loads_json(f.read(n))
        except ValueError as e:
            raise ValueError(f"{bad} (its header is not valid JSON: {e}); re-download or re-save it") from None
    if not isinstance(header, dict):
        raise ValueError(f"{bad} (its header is not a JSON object); re-download or re-save it")
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        ok = isinstance(t, dict) and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list) \
            and all(_is_int(d) and d >= 0 for d in t["shape"]) and isinstance(t.get("data_offsets"), list) \
            and len(t["data_offsets"]) == 2 and all(_is_int(o) for o in t["data_offsets"]) \
            and 0 <= t["data_offsets"][0] <= t["data_offsets"][1] <= size - 8 - n
        if not ok:
            raise ValueError(f"{bad} (tensor {name!r} has a damaged entry or lies past the end); re-download or "
                             "re-save it")
        tensors[name] = (t["dtype"], t["shape"], t["data_offsets"][1] - t["data_offsets"][0])
    return tensors


def check_checkpoint(cfg) -> list[Path]:
    """The checkpoint's files, their headers checked (read_header), every tensor a float, and as many values as
    config.json's sizes imply: checked before the model is allocated from them."""
    from engine.core.step_shape import ModelShape

    files = checkpoint_files(cfg.path)
    stored = 0
    for file in files:
        for name, (dtype, shape, size) in read_header(file).items():
            if dtype not in FLOAT_DTYPES:
                raise ValueError(f"{file.name}: {name!r} is {dtype}, not a float tensor (one of {list(FLOAT_DTYPES)}); "
                                 "this is not a checkpoint this engine runs: re-save the model in bf16")
            if size != math.prod(shape) * FLOAT_DTYPES[dtype]:
                raise ValueError(f"{file}: not a whole safetensors file ({name!r}: shape {shape} of {dtype} is not "
                                 f"the {size:,} bytes its offsets give); re-download or re-save it")
            stored += math.prod(shape)
    s = ModelShape.from_config(cfg, 1)
    norms = 2 * s.hidden_size + (2 * s.head_dim if s.qk_norm else 0)
    implied = s.linear_params + s.num_layers * norms + s.hidden_size + s.lm_head_params * (
        1 if cfg.tie_word_embeddings else 2)
    if implied > stored:
        raise ValueError(f"{cfg.path / 'config.json'}: its sizes (vocab_size {s.vocab_size:,}, hidden_size "
                         f"{s.hidden_size:,}, intermediate_size {s.intermediate_size:,}, num_hidden_layers "
                         f"{s.num_layers:,}, head_dim {s.head_dim:,}) imply {implied:,} weights, the checkpoint holds "
                         f"{stored:,}: config.json does not describe these tensors; fix its sizes")
    return files


def check_context_memory(max_model_len: int, cfg, max_num_seqs: int, block_size: int, device) -> None:
    """Refuse a context whose RoPE table ([max_model_len, head_dim] fp32, built on the CPU) and block
    tables take more than half the memory free, before they are allocated."""
    need = 4 * (max_model_len * cfg.head_dim + max_num_seqs * -(-max_model_len // block_size))
    free = free_memory(device)
    if need > free // 2:
        raise ValueError(f"a context of {max_model_len:,} tokens needs {need / 1e9:.1f} GB for its RoPE and block "
                         f"tables, more than half the {free / 1e9:.1f} GB free: lower --max-model-len (the "
                         "context in use; default: config.json's max_position_embeddings)")


def free_memory(device) -> int:
    """Bytes free in host memory and, for a GPU, on it too (the smaller)."""
    try:  # MemAvailable counts the page cache the kernel gives back (free memory alone does not)
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if device.type == "cuda":
        import torch
        free = min(free, torch.cuda.mem_get_info(device)[0])
    return free
