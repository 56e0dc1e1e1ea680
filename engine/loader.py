"""Load Hugging Face safetensors (single file or sharded) into the fused decoder."""
from __future__ import annotations

import json
import re

import torch
from safetensors import safe_open

from engine.model import CausalLM

# HF name -> (our parameter, shard index into a fused parameter or None)
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def _checkpoint_files(path) -> list:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
    else:
        files = sorted(path.glob("*.safetensors"))
    missing = [f for f in files if not f.is_file()]
    if not files or missing:
        raise FileNotFoundError(
            f"no complete safetensors checkpoint in {path} (missing: {missing or '*.safetensors'}); "
            "the engine loads Hugging Face folders saved with safe_serialization=True")
    return files


def load_weights(model: CausalLM, path) -> None:
    cfg = model.cfg
    params = dict(model.named_parameters(remove_duplicate=False))
    fused_sizes = {"qkv_proj": [cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim,
                                cfg.num_kv_heads * cfg.head_dim],
                   "gate_up_proj": [cfg.intermediate_size, cfg.intermediate_size]}
    loaded: set[str] = set()
    for file in _checkpoint_files(path):
        with safe_open(str(file), framework="pt") as f:
            for hf_name in f.keys():
                if _IGNORED.match(hf_name):
                    continue
                name = hf_name.removeprefix("model.")
                tensor = f.get_tensor(hf_name)
                parts = name.split(".")
                shard = None
                if len(parts) >= 2 and parts[-2] in _FUSED:
                    fused, shard = _FUSED[parts[-2]]
                    name = ".".join(parts[:-2] + [fused, parts[-1]])
                if name not in params:
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue  # some tied checkpoints still store the head
                    raise ValueError(f"{file.name}: unexpected tensor {hf_name!r} for {cfg.architecture}; "
                                     "the checkpoint does not match its config.json")
                param = params[name]
                target = param.data
                if shard is not None:
                    sizes = fused_sizes[name.split(".")[-2]]
                    start = sum(sizes[:shard])
                    target = target.narrow(0, start, sizes[shard])
                    loaded.add(f"{name}#{shard}")
                else:
                    loaded.add(name)
                if target.shape != tensor.shape:
                    raise ValueError(f"{file.name}: {hf_name!r} has shape {tuple(tensor.shape)}, "
                                     f"config.json implies {tuple(target.shape)}")
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


@torch.no_grad()
def load_model(cfg, dtype: torch.dtype, device: torch.device) -> CausalLM:
    with torch.device("meta"):
        model = CausalLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load_weights(model, cfg.path)
    return model.eval()
