"""Plain workloads in vllm bench's words (bench/rehearsal/plain.py), the device presets, and the calibration."""
import argparse
import dataclasses

import pytest

from engine.device_model import PRESETS, DeviceParams, kv_tokens, step_cost

from bench.rehearsal import calibration, plain
from bench.rehearsal.__main__ import main
from bench.rehearsal.checks import MAX_KV_TOKENS
from bench.rehearsal.shapes import model_folder


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A device whose memory leaves the tiny shape a cache of ~2M tokens at 0.9 (a test's bookkeeping)."""
    f = tmp_path_factory.mktemp("dev") / "small.json"
    f.write_text('{"name": "small", "memory_bytes": 1.2e9, "activation_reserve_bytes": 0.5e9}')
    return str(f)


def _args(**kw):
    flags = dict(device="h200", shape="tiny", random_input_len=40, random_output_len=24, num_prompts=6, n=1,
                 random_range_ratio=0.0,
                 max_concurrency=None, gpu_memory_utilization=0.9, max_num_seqs=4, max_num_batched_tokens=64,
                 max_model_len=None, max_kv_tokens=MAX_KV_TOKENS, self_draft=None, spec_acceptance=None, seed=0)
    return argparse.Namespace(**(flags | kw))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return model_folder("tiny", tmp_path_factory.mktemp("plain"))


@pytest.mark.parametrize("kw", [{}, {"n": 3, "max_concurrency": 2}, {"self_draft": 3, "spec_acceptance": 0.7}])
def test_plain_workload_counts_and_its_clock(folder, small, kw):
    dev = DeviceParams.named(small)
    f = plain.run(_args(device=small, **kw), folder, dev)
    n = kw.get("n", 1)
    assert f["requests"] == 6 and f["output_tokens"] == 6 * n * 24 and f["input_tokens"] == 6 * 40
    trace, shape = f["trace"], f["shape"]
    # the figures price the trace's works; their sum is the rehearsal's own virtual clock
    total = sum(step_cost(w, shape, dev)[0].total for w in trace.works)
    assert f["duration_s"] == pytest.approx(total, rel=1e-12)
    assert f["output_tokens_per_s"] == pytest.approx(6 * n * 24 / total)
    assert 0 < f["mean_ttft_ms"] and 0 < f["mean_tpot_ms"] and f["mean_itl_ms"] >= f["mean_tpot_ms"] * 0.999
    if "max_concurrency" in kw:  # two in flight at a time: later requests start after earlier ones end
        assert max(r[0] for r in trace.requests) > 0


def test_random_range_ratio_draws_lengths_around_the_given_ones(folder, small):
    f = plain.run(_args(device=small, random_range_ratio=0.5, num_prompts=12), folder, DeviceParams.named(small))
    outs = [r[4] for r in f["trace"].requests]
    assert min(outs) >= 12 and max(outs) <= 36 and len(set(outs)) > 3  # 24 +- 50%
    assert f["output_tokens"] == sum(outs) and 12 * 20 <= f["input_tokens"] <= 12 * 60


def test_the_fit_prices_a_trace_as_the_device_model_does(folder, small):
    f = plain.run(_args(device=small, self_draft=3, spec_acceptance=0.7, num_prompts=3), folder,
                  DeviceParams.named(small))
    trace, shape = f["trace"], f["shape"]
    other = dataclasses.replace(PRESETS["h100"], linear_bw_eff=0.6, attention_bw_eff=0.5, matmul_eff=0.4,
                                prefill_attention_eff=0.3, step_overhead_s=4e-4)
    secs = calibration.Features.of(trace, shape).step_seconds(shape, other)
    per_work = [step_cost(w, shape, other)[0].total for w in trace.works]
    expected, at = [], 0
    for b in trace.bounds:
        expected.append(sum(per_work[at:b]))
        at = b
    assert list(secs) == pytest.approx(expected, rel=1e-9)


def test_kv_tokens_follow_gpu_memory_utilization_as_vllm_means_it(folder, small):
    dev = DeviceParams.named(small)
    half = plain.run(_args(device=small, gpu_memory_utilization=0.5, num_prompts=1), folder, dev)
    most = plain.run(_args(device=small, gpu_memory_utilization=0.9, num_prompts=1), folder, dev)
    shape = most["shape"]
    for util, f in ((0.5, half), (0.9, most)):  # what the memory leaves after the weights and the activations
        assert f["kv_tokens"] == kv_tokens(shape, dev, util) // 16 * 16
    assert 0 < half["kv_tokens"] < most["kv_tokens"]


def test_plain_refusals(tmp_path, capsys):
    base = ["--dataset-name", "random", "--shape", "tiny", "--out", str(tmp_path)]
    assert main(base + ["--random-input-len", "100", "--random-output-len", "100", "--max-model-len", "150"]) == 2
    assert "shorter than the longest request" in capsys.readouterr().err
    assert main(base + ["--device", "a100"]) == 2
    assert "h100" in capsys.readouterr().err
    assert main(base + ["--num-prompts", "1"]) == 2  # the tiny shape on a whole H200: a cache too big to keep
    assert "--max-kv-tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--gpu-memory-utilization", "1.5"])


def test_device_presets_and_a_measured_file_over_them(tmp_path):
    h100, h200, b200 = (DeviceParams.named(k) for k in ("h100", "h200", "b200"))
    assert h100.memory_bytes == 81_559 * 2**20 and h200.memory_bytes == 143_771 * 2**20
    assert h100.hbm_bytes_per_s < h200.hbm_bytes_per_s < b200.hbm_bytes_per_s and b200.peak_flops > h200.peak_flops
    f = tmp_path / "device_params.json"
    f.write_text('{"device": "NVIDIA H100 80GB HBM3", "copy_bw_GBps": 2900.0, "matmul_tflops": 600.0}')
    p = DeviceParams.named(str(f))  # the measured figures over the H100's preset (its peak, its memory)
    assert p.hbm_bytes_per_s == pytest.approx(2.9e12) and p.matmul_eff == pytest.approx(600 / 989)
    assert p.memory_bytes == h100.memory_bytes and p.source == str(f)


def test_calibration_quick_prints_every_point(tmp_path, capsys):
    assert calibration.main(["--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(pt.name in out for pt in calibration.POINTS) and "residual" in out


def test_calibration_fits_only_points_whose_figure_its_source_states():
    """The fit's rule: a point whose figure rests on an assumption ("assumed") is a check, and the fitted
    efficiencies are Hopper's, so every fitted point ran on an H100 or H200; the table's ratio is a speed
    ratio whichever way the figure runs (a TPOT half the published is 2x as fast)."""
    assert {pt.stated for pt in calibration.POINTS} <= {"full", "partial", "assumed"}
    assert all(not pt.fit for pt in calibration.POINTS if pt.stated == "assumed")
    assert all(pt.device in ("h100", "h200") for pt in calibration.POINTS if pt.fit)
    tpot = next(pt for pt in calibration.POINTS if pt.metric == "mean_tpot_ms")
    tps = next(pt for pt in calibration.POINTS if pt.metric == "output_tokens_per_s")
    assert calibration.speed_ratio(tpot, tpot.published / 2) == pytest.approx(2.0)
    assert calibration.speed_ratio(tps, tps.published * 2) == pytest.approx(2.0)


def test_kv_bytes_per_token_as_vllm_counts_them():
    """vLLM's log for Qwen3-8B (LMCache issue #3430): 'Available KV cache memory: 6.37 GiB', then 'GPU KV
    cache size: 46,368 tokens': the rehearsal's bytes per token give the same count from the same memory."""
    from engine.core.step_shape import ModelShape
    per_token = ModelShape(36, 4096, 12288, 32, 8, 128, 151936, 2).kv_bytes_per_token
    assert per_token == 2 * 36 * 8 * 128 * 2
    low, high = (int(g * 2**30) // per_token // 16 * 16 for g in (6.365, 6.375))  # 6.37 as printed, rounded
    assert low <= 46_368 <= high
