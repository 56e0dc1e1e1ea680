"""bench.spec_acceptance --quick: the acceptance profile's shape, the replay checked against the real
speculative run, and the rehearsal reading the profile back."""
import json

import pytest

from bench.rehearsal.__main__ import main as rehearsal_main
from bench.spec_acceptance import main
from engine.rehearsal.drafter import load_profiles


def test_quick_profile_has_its_shape_and_the_rehearsal_reads_it(tiny_model_dir, tmp_path):
    out = tmp_path / "acc"
    assert main(["--quick", "--model", str(tiny_model_dir("qwen3_sharp")), "--out", str(out)]) == 0
    profile = json.loads((out / "profile.json").read_text())
    assert "135M" in profile["note"]
    for kind in ("round1", "round2"):
        for nst in (2, 4):
            e = profile["profiles"]["1.0"][kind][str(nst)]
            assert len(e["draft_len"]) == len(e["accept"]) == nst
            assert 0 < e["draft_rate"] <= 1 and sum(e["draft_len"]) == pytest.approx(1)
            assert all(0 <= a <= 1 for a in e["accept"]) and e["tokens_per_verify"] >= 1
    report = json.loads((out / "report.json").read_text())
    assert set(report["real"]) == {"1.0/round1", "1.0/round2"}
    # the replay of the real speculative run's trajectories drafts and accepts exactly as that run did
    assert all(r["replay_counters_equal"] for r in report["real"].values())
    assert len(report["replay"]) == 2 * 2 * 2  # rounds x num_speculative_tokens x siblings on/off

    assert set(load_profiles(out / "profile.json", 4, temperature=0.6)) == {"round1", "round2"}
    with pytest.raises(ValueError, match="num_speculative_tokens=3"):
        load_profiles(out / "profile.json", 3, temperature=1.0)
    r = tmp_path / "r"
    assert rehearsal_main(["--shape", "tiny", "--preset", "low", "--problems", "1", "--prompt-tokens", "64",
                           "--mean-tokens", "200", "--conclusion-tokens", "20", "--kv-tokens", "20000",
                           "--config", "engine", "--config", "spec-ngram", "--spec-profile", str(out / "profile.json"),
                           "--out", str(r), "--quiet"]) == 0
    engine, spec = (json.loads((r / n / "report.json").read_text()) for n in ("engine", "spec-ngram"))
    assert spec["overall"]["tokens"] == engine["overall"]["tokens"]
    assert spec["spec"]["spec_decode_num_drafts"] > 0 and spec["steps"] < engine["steps"]
