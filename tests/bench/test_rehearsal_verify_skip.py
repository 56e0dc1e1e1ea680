"""The rehearsal's configurations of issue 51's drafting policies: verify-guided selection (its acceptance the
same-read window's raised by the measured verify / window gain, past the measured contexts by no more than
the published Quest one nor its last measured gain) and layer skipping (the window's scaled by the measured
layer-skip / full-depth ratio, never above 1). The profile sections are written here as fixtures: a missing
one is refused, naming the bench command that measures it."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.rehearsal.drafter import (VEGAS_QUEST_OVER_STREAMING, WindowProfile, _tokens_per_verify,
                                      load_self_layerskip)

from bench.rehearsal.__main__ import CONFIGS
from bench.rehearsal.checks import Refused
from bench.rehearsal.profiles import spec_profiles

ROOT = Path(__file__).parents[2]
REAL = ROOT / "bench" / "rehearsal" / "spec_profile.json"
BINS = ((1024, 2048), (2048, 4096), (4096, 8192))
VERIFY = ("fp8+spec-verify", "fp8+fp8w+spec-verify")
SKIP = ("fp8+spec-skip", "fp8+fp8w+spec-skip")


def _bins(pairs, window="512/16"):
    """Context bins whose tokens per verify step at 4 and 6 drafts are the given [base, other] pairs."""
    return [{"context": list(c), "window": window, "tokens_per_verify": {"4": list(p), "6": list(p)}}
            for c, p in zip(BINS, pairs)]


def _fixture(tmp_path, verify=None, layerskip=None) -> str:
    """The committed profile with these sections in place of the measured ones, in the shapes issue 51's benches write."""
    raw = json.loads(REAL.read_text())
    raw.pop("self_verify", None), raw.pop("self_layerskip", None)  # only the sections given here
    if verify is not None:
        raw["self_verify"] = {"profiles": {"1.0": {"coupled": {"256/256/16": _bins(verify, "256/16")}}}}
    if layerskip is not None:
        raw["self_layerskip"] = {"layers": 30, "profiles": {"1.0": {"coupled": layerskip}}}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _profile(path: str, config: str, acceptance=None) -> WindowProfile:
    args = argparse.Namespace(spec_acceptance=acceptance, spec_profile=path, spec_self_rule="coupled", shape="qwen3-8b")
    return spec_profiles(args, CONFIGS[config], 1.0)


@pytest.mark.parametrize("config", VERIFY)
def test_verify_guided_acceptance_is_the_window_raised_by_its_measured_gain_and_no_more_past_it(tmp_path, config):
    path = _fixture(tmp_path, verify=[(4.0, 4.4), (4.0, 4.2), (4.0, 4.12)])  # gains 1.10, 1.05, 1.03
    verify, window = _profile(path, config), _profile(path, "fp8+spec-self")
    for context, gain in ((1500, 1.10), (3000, 1.05), (6000, 1.03)):
        assert _tokens_per_verify(verify.at(context)) == pytest.approx(gain * _tokens_per_verify(window.at(context)))
    for context in (16_384, 49_000, 100_000):  # past 8k: the last measured 1.03, below the published 1.10
        assert _tokens_per_verify(verify.at(context)) == pytest.approx(1.03 * _tokens_per_verify(window.at(context)))
    big = _profile(_fixture(tmp_path, verify=[(4.0, 6.0)] * 3), config)  # a measured 1.5: Quest's 1.10 past 8k
    assert _tokens_per_verify(big.at(49_000)) == pytest.approx(VEGAS_QUEST_OVER_STREAMING
                                                               * _tokens_per_verify(window.at(49_000)))


@pytest.mark.parametrize("config", SKIP)
def test_layer_skip_acceptance_is_the_window_scaled_by_its_measured_ratio_never_above_it(tmp_path, config):
    entries = {"15/30": _bins([(4.0, 2.0)] * 3), "22/30": _bins([(4.0, 3.6), (4.0, 3.4), (4.0, 3.2)]),
               "30/30": _bins([(4.0, 4.0)] * 3), "22/30 spread": _bins([(4.0, 4.0)] * 3)}
    path = _fixture(tmp_path, layerskip=entries)
    skip, window = _profile(path, config), _profile(path, "fp8+spec-self")
    # 27 of 36 layers (0.75): the measured entry keeping the most at or below that share, 22/30 (0.733)
    for context, ratio in ((1500, 0.9), (3000, 0.85), (6000, 0.8), (49_000, 0.8), (120_000, 0.8)):
        assert _tokens_per_verify(skip.at(context)) == pytest.approx(ratio * _tokens_per_verify(window.at(context)))
    better = _fixture(tmp_path, layerskip={"22/30": _bins([(4.0, 4.4)] * 3)})  # a measured gain is not taken
    assert _profile(better, config).at(49_000) == pytest.approx(window.at(49_000))


def test_the_flat_what_if_applies_to_the_new_configs_too(tmp_path):
    for config in (*VERIFY, *SKIP):
        assert _profile(str(tmp_path / "absent.json"), config, acceptance=0.7) == WindowProfile.flat(0.7, 6)


def test_a_missing_section_or_share_is_refused_naming_the_bench_that_measures_it(tmp_path):
    path = _fixture(tmp_path)
    with pytest.raises(Refused, match="no self_verify profile in it; write one with python -m bench.spec_sparse_acceptance"):
        _profile(path, "fp8+spec-verify")
    with pytest.raises(Refused, match="no self_layerskip profile in it; write one with python -m "
                                      "bench.spec_layerskip_acceptance"):
        _profile(path, "fp8+spec-skip")
    few = _fixture(tmp_path, layerskip={"28/30": _bins([(4.0, 3.9)] * 3)})  # keeps more than 27 of 36 would
    with pytest.raises(ValueError, match="a share of the layers at most 27/36"):
        load_self_layerskip(few, 27, 36, 512, 16, "coupled", 1.0)


def test_the_configs_name_the_engines_keys_and_help_lists_them():
    for config in VERIFY:
        spec = CONFIGS[config]["speculative_config"]
        assert spec["selection"] == "verify" and spec["selected"] + spec["window"] == 512
    for config in SKIP:
        assert 0 < CONFIGS[config]["speculative_config"]["draft_layers"] < 36
    out = subprocess.run([sys.executable, "-m", "bench.rehearsal", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    for name in (*VERIFY, *SKIP):
        assert name in out
