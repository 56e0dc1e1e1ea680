"""Hostile model folders (issue 52, item 2): whatever is wrong with config.json, generation_config.json, the
index or the safetensors files is one ValueError naming the file, the field and the fix (the CLI's exit 2:
tests/pacore/test_pacore_hostile_folders.py), checked before torch allocates what the files declare."""
import json
import os
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.overrides import TorchFunctionMode

import engine.worker.checkpoint_checks as checks
from engine import LLM
from test_compressed_tensors import QUANTIZATION_CONFIG, SCHEME

WEIGHTS = "model.safetensors"


def config(**fields):
    def mutate(d):
        cfg = json.loads((d / "config.json").read_text()) | fields
        (d / "config.json").write_text(json.dumps(cfg))
    return mutate


def text(name, content):
    def mutate(d):
        (d / name).write_text(content)
    return mutate


def header(length: int, keep: int | None = None):
    """model.safetensors with its header's length field set to ``length`` (and cut to ``keep`` bytes)."""
    def mutate(d):
        data = (d / WEIGHTS).read_bytes()
        (d / WEIGHTS).write_bytes((struct.pack("<Q", length) + data[8:])[:keep])
    return mutate


def header_entry(name, key, value):
    """model.safetensors with one tensor's header entry changed (the header padded to its length)."""
    def mutate(d):
        data = (d / WEIGHTS).read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        entries = json.loads(data[8:8 + n])
        entries[name][key] = value(entries) if callable(value) else value
        (d / WEIGHTS).write_bytes(data[:8] + json.dumps(entries, separators=(",", ":")).encode().ljust(n) + data[8 + n:])
    return mutate


def tensor_as(dtype):
    def mutate(d):
        tensors = load_file(str(d / WEIGHTS))
        name = "model.layers.0.self_attn.q_proj.weight"
        tensors[name] = tensors[name] > 0 if dtype is torch.bool else tensors[name].to(dtype)
        save_file(tensors, str(d / WEIGHTS), metadata={"format": "pt"})
    return mutate


def linked_outside(d):
    outside = d.parent / f"{d.name}-elsewhere.safetensors"
    shutil.move(d / WEIGHTS, outside)
    (d / WEIGHTS).symlink_to(outside)


def quantization(**changes):
    return config(quantization_config=QUANTIZATION_CONFIG | changes)


CASES = {  # name -> (how the folder is damaged, what the one-line refusal names)
    "config-not-an-object": (text("config.json", "[1, 2]"), ("config.json", "JSON object")),
    "generation-config-not-an-object": (text("generation_config.json", "[1]"), ("generation_config.json", "JSON object")),
    "eos-a-string": (text("generation_config.json", '{"eos_token_id": "x"}'), ("generation_config.json", "eos_token_id")),
    "heads-a-string": (config(num_attention_heads="8"), ("config.json", "num_attention_heads", "positive integer")),
    "heads-a-list": (config(num_attention_heads=[4]), ("config.json", "num_attention_heads")),
    "heads-a-bool": (config(num_attention_heads=True), ("config.json", "num_attention_heads")),
    "heads-a-float": (config(num_attention_heads=4.0), ("config.json", "num_attention_heads")),
    "heads-negative": (config(num_attention_heads=-4), ("config.json", "num_attention_heads")),
    "heads-zero": (config(num_attention_heads=0), ("config.json", "num_attention_heads")),
    "kv-heads-zero": (config(num_key_value_heads=0), ("config.json", "num_key_value_heads")),
    "heads-do-not-divide": (config(num_key_value_heads=3), ("config.json", "num_key_value_heads", "multiple")),
    "hidden-negative": (config(hidden_size=-64), ("config.json", "hidden_size")),
    "layers-a-string": (config(num_hidden_layers="2"), ("config.json", "num_hidden_layers")),
    "eps-a-string": (config(rms_norm_eps="x"), ("config.json", "rms_norm_eps")),
    "tie-a-string": (config(tie_word_embeddings="yes"), ("config.json", "tie_word_embeddings")),
    "rope-a-string": (config(rope_parameters="x"), ("config.json", "rope_parameters")),
    "rope-theta-a-string": (config(rope_parameters={"rope_type": "default", "rope_theta": "1e4"}),
                            ("config.json", "rope_parameters.rope_theta")),
    "rope-factor-absurd": (config(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 1e308}),
                           ("config.json", "rope_parameters.factor")),
    "architectures-a-string": (config(architectures="Qwen3ForCausalLM"), ("config.json", "architectures")),
    "transformers-refuses": (config(num_hidden_layers=3), ("config.json", "transformers cannot read it")),
    "index-not-an-object": (text("model.safetensors.index.json", "[1]"), ("model.safetensors.index.json", "weight_map")),
    "weight-map-a-list": (text("model.safetensors.index.json", '{"weight_map": [1]}'),
                          ("model.safetensors.index.json", "weight_map")),
    "weight-map-outside": (text("model.safetensors.index.json", '{"weight_map": {"x": "../elsewhere.safetensors"}}'),
                           ("../elsewhere.safetensors", "outside the model folder")),
    "symlink-outside": (linked_outside, (WEIGHTS, "outside the model folder")),
    "header-past-the-end": (header(10**6, keep=100), (WEIGHTS, "header claims 1,000,000 bytes")),
    "header-absurd": (header(2**62), (WEIGHTS, "not a whole safetensors file")),
    "file-of-3-bytes": (text(WEIGHTS, "abc"), (WEIGHTS, "not a whole safetensors file")),
    "shape-not-its-bytes": (header_entry("model.norm.weight", "shape", [32]),
                            (WEIGHTS, "model.norm.weight", "not a whole safetensors file")),
    "offsets-overlap": (header_entry("model.layers.0.self_attn.k_norm.weight", "data_offsets",
                                     lambda h: h["model.layers.0.self_attn.q_norm.weight"]["data_offsets"]),
                        (WEIGHTS, "not a whole safetensors file")),
    "integer-tensor": (tensor_as(torch.int32), (WEIGHTS, "q_proj.weight", "I32", "not a float tensor")),
    "bool-tensor": (tensor_as(torch.bool), (WEIGHTS, "BOOL", "not a float tensor")),
    "complex-tensor": (tensor_as(torch.complex64), (WEIGHTS, "C64", "not a float tensor")),
    "quant-groups-a-list": (quantization(config_groups=[SCHEME]), ("config.json", "config_groups")),
    "quant-group-a-string": (quantization(config_groups={"group_0": "x"}), ("config.json", "config_groups")),
    "quant-weights-a-list": (quantization(config_groups={"group_0": SCHEME | {"weights": [8]}}),
                             ("config.json", "weights must be an object")),
    "quant-ignore-bad-regex": (quantization(ignore=["lm_head", "re:model.(layers"]),
                               ("config.json", "re:model.(layers", "regular expression")),
}


def folder(tmp_path, src, mutate):
    d = tmp_path / "model"
    shutil.copytree(src, d)
    mutate(d)
    return d


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_model_folder_is_refused_in_one_line_naming_the_file_and_the_field(tiny_model_dir, tmp_path, case):
    mutate, named = CASES[case]
    d = folder(tmp_path, tiny_model_dir("qwen3"), mutate)
    with pytest.raises(ValueError) as refused:
        LLM(str(d), skip_tokenizer_init=True, num_kv_blocks=8)
    message = str(refused.value)
    assert "\n" not in message and all(n in message for n in named), message


class NoHugeTensors(TorchFunctionMode):
    """Fails any torch factory call (empty, zeros, arange, ...) of more than ``limit`` elements, before it
    allocates: its shape is worked out on the meta device first."""
    FACTORIES = {torch.empty, torch.empty_like, torch.zeros, torch.ones, torch.arange, torch.full, torch.empty_strided}

    def __init__(self, limit=10**8):
        super().__init__()
        self.limit = limit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FACTORIES:
            n = func(*args, **{**kwargs, "device": "meta"}).numel()
            assert n <= self.limit, f"torch.{func.__name__} of {n:,} elements"
        return func(*args, **kwargs)


@pytest.mark.parametrize("fields, named", [
    ({"max_position_embeddings": 10**12}, "max_position_embeddings"),
    ({"vocab_size": 10**10}, "vocab_size 10,000,000,000"),
    ({"head_dim": 10**9}, "head_dim 1,000,000,000"),
    ({"intermediate_size": 10**9}, "intermediate_size 1,000,000,000"),
])
def test_absurd_declared_sizes_are_refused_before_torch_allocates_them(tiny_model_dir, tmp_path, fields, named):
    d = folder(tmp_path, tiny_model_dir("qwen3"), config(**fields))
    with NoHugeTensors(), pytest.raises(ValueError, match=named):
        LLM(str(d), skip_tokenizer_init=True, num_kv_blocks=8)


def test_the_rope_table_is_sized_by_the_context_in_use_and_refused_beyond_memory(tiny_model_dir, tmp_path, monkeypatch):
    d = folder(tmp_path, tiny_model_dir("qwen3_plain"), config(max_position_embeddings=checks.MAX_POSITIONS))
    monkeypatch.setattr(checks, "free_memory", lambda device: 2**30)  # a machine with 1 GiB free
    with NoHugeTensors(), pytest.raises(ValueError, match="lower --max-model-len"):
        LLM(str(d), skip_tokenizer_init=True, num_kv_blocks=8)  # the declared 16M positions: 3 GB of tables
    with NoHugeTensors():
        llm = LLM(str(d), skip_tokenizer_init=True, num_kv_blocks=8, max_model_len=2048)
    assert llm.runner.cos_sin.shape[0] == 2048


def test_a_hub_snapshots_links_into_its_own_blobs_still_load(tiny_model_dir, tmp_path):
    """Hugging Face's cache: models--org--name/snapshots/REV/model.safetensors -> ../../blobs/SHA."""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "abc123"
    shutil.copytree(tiny_model_dir("qwen3"), snapshot)
    (repo / "blobs").mkdir()
    shutil.move(snapshot / WEIGHTS, repo / "blobs" / "sha")
    os.symlink(os.path.join("..", "..", "blobs", "sha"), snapshot / WEIGHTS)
    assert LLM(str(snapshot), skip_tokenizer_init=True, num_kv_blocks=8).config.num_layers == 2
