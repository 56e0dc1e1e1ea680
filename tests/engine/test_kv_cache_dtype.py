"""LLM(kv_cache_dtype=...): the option, the cache's allocation and sizing, and what stats report."""
import argparse

import pytest
import torch

from engine import LLM
from engine.config import ENGINE_FLAGS, EngineConfig, add_engine_flags, engine_kwargs
from engine.worker.kv_cache import resolve_kv_dtype


def test_kv_cache_dtype_is_checked_with_the_choices():
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \['auto', 'fp8_e4m3', 'fp8_e5m2'\]"):
        EngineConfig(kv_cache_dtype="int8")
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8_e4m3"  # vLLM's spelling (issue 47)
    assert resolve_kv_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_dtype("fp8_e4m3", torch.bfloat16) == torch.float8_e4m3fn
    assert resolve_kv_dtype("fp8_e5m2", torch.float32) == torch.float8_e5m2


def test_the_flag_is_derived_from_the_field():
    assert "kv_cache_dtype" in ENGINE_FLAGS
    p = argparse.ArgumentParser()
    add_engine_flags(p)
    assert engine_kwargs(p.parse_args(["--kv-cache-dtype", "fp8_e5m2"])) == {"kv_cache_dtype": "fp8_e5m2"}
    assert "kv_cache_dtype" not in engine_kwargs(p.parse_args([]))  # auto: the engine's default
    with pytest.raises(SystemExit):
        p.parse_args(["--kv-cache-dtype", "int8"])


def test_serve_and_run_take_the_flag():
    from engine.serve.command import SERVE_FLAGS
    from pacore.cli import build_parser
    assert "kv_cache_dtype" in SERVE_FLAGS
    args = build_parser().parse_args(["serve", "--kv-cache-dtype", "fp8_e4m3"])
    assert args.kv_cache_dtype == "fp8_e4m3"
    args = build_parser().parse_args(["run", "--kv-cache-dtype", "fp8_e4m3", "--data", "x.jsonl",
                                      "--out", "o.jsonl"])
    assert args.kv_cache_dtype == "fp8_e4m3"


@pytest.mark.parametrize("fmt, torch_dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_cache_is_one_byte_a_value_and_holds_twice_the_tokens(tiny_model_dir, fmt, torch_dtype):
    path = str(tiny_model_dir("llama"))  # 2 layers, 2 KV heads of 16: 128 values per token
    memory = 1 << 20
    bf16 = LLM(path, dtype="bfloat16", kv_cache_memory=memory, max_model_len=256)
    fp8 = LLM(path, dtype="bfloat16", kv_cache_memory=memory, max_model_len=256, kv_cache_dtype=fmt)
    assert fp8.runner.kv_cache.dtype == torch_dtype and bf16.runner.kv_cache.dtype == torch.bfloat16
    assert fp8.runner.kv_cache.element_size() == 1
    s, t = bf16.stats(), fp8.stats()
    assert (s["kv_cache_dtype"], t["kv_cache_dtype"]) == ("bfloat16", fmt)
    assert (s["kv_bytes_per_token"], t["kv_bytes_per_token"]) == (2 * 2 * 2 * 16 * 2, 2 * 2 * 2 * 16)
    assert t["kv_bytes_per_block"] * 2 == s["kv_bytes_per_block"]
    assert t["kv_blocks_total"] == 2 * s["kv_blocks_total"]
    assert t["kv_cache_tokens"] == t["kv_blocks_total"] * 16 == memory // t["kv_bytes_per_token"]


def test_the_startup_line_says_how_many_tokens_fit(tiny_model_dir, caplog):
    with caplog.at_level("INFO", logger="engine"):
        LLM(str(tiny_model_dir("llama")), num_kv_blocks=40, max_model_len=256, kv_cache_dtype="fp8_e4m3")
    assert "KV cache fp8_e4m3: 640 tokens (40 blocks of 16), 128 bytes per token" in caplog.text


def test_rehearsal_counts_one_byte_per_kv_value(tiny_model_dir):
    from engine.config import ModelConfig
    from engine.device_model import DeviceParams
    from engine.rehearsal.runner import RehearsalRunner
    cfg = ModelConfig.from_pretrained(tiny_model_dir("llama"))
    runners = {fmt: RehearsalRunner(cfg, torch.bfloat16, 16, 8, 256, DeviceParams(), kv_cache_dtype=fmt)
               for fmt in ("auto", "fp8_e4m3")}
    assert runners["fp8_e4m3"].shape.kv_dtype_bytes == 1 and runners["auto"].shape.kv_dtype_bytes == 2
    assert runners["fp8_e4m3"].kv_bytes_per_block * 2 == runners["auto"].kv_bytes_per_block
    blocks = {fmt: r.auto_num_blocks(None, 0.9) for fmt, r in runners.items()}
    assert blocks["fp8_e4m3"] in (2 * blocks["auto"], 2 * blocks["auto"] + 1)


def test_metrics_report_the_kv_format_and_bytes_per_token(tiny_model_dir):
    pytest.importorskip("prometheus_client")
    from engine.serve.metrics import ServerMetrics

    class Engine:  # what the collector reads of the server's engine loop
        latest_stats = {**LLM(str(tiny_model_dir("llama")), num_kv_blocks=40, max_model_len=256,
                              kv_cache_dtype="fp8_e5m2").stats(), "num_requests": 0}

        def rates(self):
            return 0.0, 0.0
    text = ServerMetrics(Engine()).render().decode()
    assert 'pacore_kv_cache_info{dtype="fp8_e5m2"} 1.0' in text
    assert "pacore_kv_bytes_per_token 128.0" in text and "pacore_kv_cache_tokens 640.0" in text
