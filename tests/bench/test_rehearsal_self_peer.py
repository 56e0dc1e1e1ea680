"""The speculative headline's assumptions (issue 44): self-drafting's default acceptance past the measured
contexts follows the published long-context figures, the like-for-like peer (vLLM's scheduler with the RFC
#47351 fork's StreamingLLM drafter), the H100 NVL preset, and --config in the plain (vllm bench) mode."""
import argparse
from pathlib import Path

import pytest

from engine.device_model import PRESETS, DeviceParams, DraftRead, preset_of, speculation_seconds
from engine.rehearsal.drafter import MAGICDEC_STREAMINGLLM_512, WindowProfile
from engine.spec.config import SpeculativeConfig
from engine.core.step_shape import ModelShape

from bench.rehearsal.__main__ import CONFIGS, main
from bench.rehearsal.profiles import spec_profiles
from bench.rehearsal.published import POINTS

PROFILE = str(Path(__file__).parents[2] / "bench" / "rehearsal" / "spec_profile.json")


def _default(config: str, acceptance=None) -> WindowProfile:
    args = argparse.Namespace(spec_acceptance=acceptance, spec_profile=PROFILE, spec_self_rule="coupled")
    return spec_profiles(args, CONFIGS[config], 1.0)


@pytest.mark.parametrize("config", ["fp8+spec-self", "fp8+fp8w+spec-self", "vllm-fp8+self"])
def test_default_self_drafting_acceptance_at_64k_is_at_most_the_published_079(config):
    """MagicDec's 512-token StreamingLLM draft accepts 0.79 per token at 64k and 100k of context: the default
    profile is not the 135M model's last measured bin (0.90-0.93 at 4-8k) read flat beyond it."""
    profile = _default(config)
    for context in (40_000, 49_000, 65_536, 100_000, 131_072):
        assert max(profile.at(context)) <= 0.79
    # each published context at most its published figure, and the acceptance never rises with context
    for context, published in MAGICDEC_STREAMINGLLM_512:
        assert max(profile.at(context)) <= published
    firsts = [profile.at(c)[0] for c in (1_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000)]
    assert firsts == sorted(firsts, reverse=True)


def test_below_the_published_curve_a_measured_profile_is_kept():
    """Within the measured contexts: the lower of the measured and the published figure, position by
    position; past them: the published curve, not the last measured bin."""
    measured = WindowProfile((4096, 8192), ((0.5, 0.95), (0.9, 0.6)))
    capped = measured.capped()
    assert capped.at(3000) == (0.5, 0.84)
    assert capped.at(8000) == (0.83, 0.6)
    assert capped.at(20_000) == (0.81, 0.81) and capped.at(1 << 20) == (0.79, 0.79)


def test_the_uncapped_profile_reads_the_last_measured_bin_flat():
    args = argparse.Namespace(spec_acceptance=None, spec_profile=PROFILE, spec_self_rule="coupled",
                              spec_self_uncapped=True)
    measured = spec_profiles(args, CONFIGS["fp8+spec-self"], 1.0)
    assert measured.at(65_536) == measured.at(8_000) and min(measured.at(65_536)) > 0.85


def test_spec_acceptance_still_overrides_the_default():
    assert _default("fp8+spec-self", 0.9).at(65_536) == (0.9,) * 6
    assert _default("vllm-fp8+self", 0.6).at(100_000) == (0.6,) * 4


def test_the_self_drafting_peer_is_vllms_scheduler_with_the_forks_streamingllm_drafter(capsys):
    """vllm-fp8+self: vLLM's defaults (the vllm-fp8 baseline) and the fork's drafter: a sink of one block,
    a window of 5% of the context and at least 256 tokens, 4 drafts at a fixed depth."""
    spec = {"method": "self_window", "num_speculative_tokens": 4, "window": 256, "window_fraction": 0.05,
            "sink": 16, "policy": "fixed"}
    assert CONFIGS["vllm-fp8+self"] == CONFIGS["vllm-fp8"] | {"speculative_config": spec}
    assert CONFIGS["vllm-fp8+fp8w+self"] == CONFIGS["vllm-fp8+self"] | {"quantization": "fp8"}
    assert CONFIGS["vllm+self"] == CONFIGS["vllm"] | {"speculative_config": spec}
    cfg = SpeculativeConfig.from_dict(spec)
    assert [cfg.window_at(c) for c in (1_000, 5_120, 10_000, 40_960)] == [256, 256, 500, 2048]
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "vllm-fp8+self" in capsys.readouterr().out


@pytest.mark.parametrize("fraction", [-0.1, 1.5, "0.05", True])
def test_a_window_fraction_outside_0_to_1_is_refused(fraction):
    with pytest.raises(ValueError, match="window_fraction"):
        SpeculativeConfig.from_dict({"method": "self_window", "window_fraction": fraction})
    with pytest.raises(ValueError, match="apply to method 'self_window'"):
        SpeculativeConfig.from_dict({"method": "ngram", "window_fraction": 0.05})


def test_a_window_that_grows_with_context_costs_its_reads():
    """A draft step reads sink + max(window, fraction x context) tokens of KV per row: at a 100k context the
    fork's 5% window reads ~5k tokens where a fixed 512 reads 528; below 5,120 tokens both read 256 + 16."""
    shape = ModelShape(num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                       intermediate_size=12288, vocab_size=151936, dtype_bytes=2, kv_dtype_bytes=2)
    h200 = PRESETS["h200"]
    fixed = speculation_seconds(shape, h200, DraftRead(256, 16))
    grows = speculation_seconds(shape, h200, DraftRead(256, 16, 0.05))
    assert grows([4_000] * 64, 4)[0] == fixed([4_000] * 64, 4)[0]
    assert grows([100_000] * 64, 4)[0] == speculation_seconds(shape, h200, DraftRead(5_000, 16))([100_000] * 64, 4)[0]
    assert grows([100_000] * 64, 4)[0] > 2 * fixed([100_000] * 64, 4)[0]
    assert grows([100_000] * 64, 4)[1] == fixed([100_000] * 64, 4)[1]  # the verify pass reads it all either way


def test_the_h100_nvl_preset():
    nvl, h100 = DeviceParams.named("h100-nvl"), PRESETS["h100"]
    assert nvl.memory_bytes == 95_830 * 2**20 and nvl.peak_flops == 835e12
    assert nvl.hbm_bytes_per_s == pytest.approx(3.9e12 * 4.0 / 4.8) and nvl.hbm_bytes_per_s > h100.hbm_bytes_per_s
    assert preset_of("NVIDIA H100 NVL") is nvl and preset_of("NVIDIA H100 80GB HBM3") is h100
    assert "h100-nvl-fitted" in PRESETS


def test_the_rfc_points_state_their_workload_and_run_its_configs():
    """RFC #47351's benchmark script: 960 requests, 128 sequences, 40,960 tokens of context; plain on vLLM's
    scheduler, speculative with the fork's drafter, on the H100 and the poster's H100 NVL; checks, not fitted."""
    rfc = [pt for pt in POINTS if "AIME25" in pt.name]
    assert {(pt.device, pt.config) for pt in rfc} == {(d, c) for d in ("h100", "h100-nvl") for c in ("vllm", "vllm+self")}
    for pt in rfc:
        assert (pt.flags["num_prompts"], pt.flags["max_num_seqs"], pt.flags["max_model_len"]) == (960, 128, 40_960)
        assert not pt.fit and pt.stated == "assumed" and pt.config in CONFIGS


PLAIN = ["--dataset-name", "random", "--shape", "tiny", "--random-input-len", "40", "--random-output-len", "24",
         "--num-prompts", "6", "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "128"]


@pytest.fixture
def plain(tmp_path):
    """The plain mode's flags on a device whose memory leaves the tiny shape a cache of ~2M tokens."""
    device = tmp_path / "small.json"
    device.write_text('{"name": "small", "memory_bytes": 1.2e9, "activation_reserve_bytes": 0.5e9}')
    return PLAIN + ["--device", str(device), "--out", str(tmp_path / "out")]


def _figures(out: str) -> dict[str, dict[str, str]]:
    """Each configuration's printed figures: {config: {label: value}}."""
    blocks, name = {}, None
    for line in out.splitlines():
        if line.startswith("===="):
            name = line.split("(")[1].split(",")[0]
            blocks[name] = {}
        elif ":" in line and name is not None:
            label, value = line.rsplit(":", 1)
            blocks[name][label.strip()] = value.strip()
    return blocks


def test_plain_mode_honours_config(plain, capsys):
    """--config in the vllm-bench mode runs that configuration (it printed the defaults' figures before):
    FP8 KV doubles the cache, drafting changes the steps."""
    assert main(plain + ["--config", "vllm", "--config", "vllm-fp8",
                         "--config", "vllm-fp8+self", "--spec-acceptance", "0.9"]) == 0
    fig = _figures(capsys.readouterr().out)
    assert set(fig) == {"vllm", "vllm-fp8", "vllm-fp8+self"}
    kv = {k: int(v["GPU KV cache size (tokens)"].replace(",", "")) for k, v in fig.items()}
    assert kv["vllm-fp8"] > 1.9 * kv["vllm"] and kv["vllm-fp8+self"] == kv["vllm-fp8"]
    assert fig["vllm-fp8+self"]["Engine steps"] != fig["vllm-fp8"]["Engine steps"]
    assert fig["vllm"]["Total generated tokens"] == fig["vllm-fp8+self"]["Total generated tokens"] == "144"


def test_plain_mode_refuses_two_drafters(plain, capsys):
    assert main(plain + ["--config", "vllm-fp8+self", "--self-draft", "4"]) == 2
    assert "--self-draft and --config vllm-fp8+self" in capsys.readouterr().err
