"""The GPU check's random checkpoints: Qwen3 shapes, writing one, and finding the one a check wrote.

The engine stages (bench/gpu/e2e.py) load a Qwen3-8B-shaped checkpoint of random weights (shapes and
dtype set the speed, not the values). It is written once into a folder the check creates and marks
(OWNER_MARK first, COMPLETE last) and reused; a folder the check did not create is never written into,
so PACORE_GPU_CHECKPOINT pointed at a real model is refused, not overwritten.
"""
from __future__ import annotations

import json
from pathlib import Path

from engine.testing import write_char_tokenizer

# PaCoRe-8B's context as the paper runs it: 131,072 tokens, YaRN scale 2.0 "without modifying attention
# temperature" (arXiv 2601.05593, section 3.2), so the original context is 131,072 / 2 = 65,536 and the
# attention factor 1.0; the same setting as docs/pacore-runs.md's command.
PACORE_YARN = dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=65536, attention_factor=1.0)
QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=dict(PACORE_YARN, rope_theta=1_000_000.0))
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0))  # bench/pacore_throughput.py
# A 2-layer model for CPU runs; its YaRN original context is short (1024), so a CPU reaches past it.
TINY = dict(QWEN3_8B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
            tie_word_embeddings=True, rope_parameters=dict(rope_type="yarn", rope_theta=1_000_000.0, factor=4.0,
                                                           original_max_position_embeddings=1024))
OWNER_MARK = ".pacore-gpu-check"  # written first into a folder the check creates
COMPLETE = "complete"  # written last, once every shard is


def write_random_model(folder: str | Path, shape: dict = QWEN3_8B, dtype: str = "bfloat16", seed: int = 0,
                       device: str = "cpu", shard_bytes: int = 4 << 30) -> Path:
    """A Qwen3 checkpoint with random N(0, 0.02) weights (norms at 1), in safetensors shards of about
    shard_bytes, drawn on `device` (a GPU draws 8B values in seconds). Parameter names come from a
    transformers model built on the meta device."""
    import torch
    import transformers
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = transformers.Qwen3Config(bos_token_id=2, eos_token_id=1, pad_token_id=0, **shape)
    cfg.architectures = ["Qwen3ForCausalLM"]
    with torch.device("meta"):
        names = {k: v.shape for k, v in transformers.Qwen3ForCausalLM(cfg).state_dict().items()}
    g = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, dtype)
    shards, cur, size, weight_map = [], {}, 0, {}
    for name, shp in names.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        t = torch.ones(shp, device=device) if name.endswith("norm.weight") else \
            torch.randn(shp, generator=g, device=device) * 0.02
        cur[name] = t.to(dt).cpu().contiguous()
        size += cur[name].nbytes
        if size >= shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
    shards.append(cur)
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    if len(shards) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg.dtype = dtype
    cfg.save_pretrained(folder)
    write_char_tokenizer(folder, cfg.vocab_size)
    return folder


def foreign_folder(path: str | Path) -> str | None:
    """Why the check must not write into `path` (one line), or None: a folder that exists, is not empty
    and lacks the check's marks was not created by it (a downloaded model, say), and its shards, config
    and tokenizer would be overwritten."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"PACORE_GPU_CHECKPOINT={path} is a file, not a folder; point it at a new or empty folder"
    if not path.is_dir() or not any(path.iterdir()):
        return None
    if (path / OWNER_MARK).is_file() or (path / COMPLETE).is_file():
        return None
    return (f"PACORE_GPU_CHECKPOINT={path} holds files this check did not write (no {OWNER_MARK} in it), and the "
            f"check never writes into such a folder: point it at a new or empty folder")


def checkpoint_folder(path: Path, shape: dict, dtype: str, device: str, write: bool = True) -> Path:
    """The random checkpoint at path, written there first unless a complete one is (`complete` is written
    last). write=False: a missing or cut one is an error that says so, not a write in the caller's time.
    A folder the check did not create is refused (foreign_folder), written or not."""
    if (why := foreign_folder(path)) is not None:
        raise PermissionError(why)
    marker = path / COMPLETE
    if not marker.is_file():
        if not write:
            raise FileNotFoundError(f"no complete checkpoint at {path}: its write (the `checkpoint` stage) was cut "
                                    f"or failed. Write it: python3 -m bench.gpu.e2e --only checkpoint --checkpoint {path}")
        path.mkdir(parents=True, exist_ok=True)
        (path / OWNER_MARK).write_text("written by bench/gpu/check.sh; safe to delete\n")
        write_random_model(path, shape, dtype, device=device)
        marker.write_text(json.dumps(dict(shape=shape, dtype=dtype)))
    elif json.loads(marker.read_text()) != json.loads(json.dumps(dict(shape=shape, dtype=dtype))):
        raise ValueError(f"{path} holds another model than this run's; delete it or pass another --checkpoint")
    return path
