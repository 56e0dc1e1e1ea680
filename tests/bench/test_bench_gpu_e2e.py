"""bench.gpu_e2e --tiny: command 2's code path on CPU (a tiny random YaRN Qwen3, every section)."""
import json

from bench.gpu_e2e import main


def test_tiny_runs_every_section(tmp_path):
    assert main(["--tiny", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_e2e.json").read_text())
    assert not [k for k in report if k.endswith("_error")]
    assert report["load"]["kv_tokens"] > 0 and report["load"]["weights_GB"] > 0
    # fp32 torch path vs transformers fp32, teacher-forced on each child's sampled tokens
    assert set(report["logits"]) == {"cascade=True graphs=False", "cascade=False graphs=False"}
    for r in report["logits"].values():
        assert r["top1_agree"] == 1.0 and r["max_abs_err"] < 1e-4 and r["same_tokens_as_first"]
    rows = report["throughput"]
    assert {(r["case"], r["cascade"]) for r in rows} == {(c, on) for c in ("round1", "round2", "past_64k")
                                                        for on in (True, False)}
    for r in rows:
        assert r["decode_tok_s"] > 0 and r["gen_tokens"] == r["problems"] * r["n"] * 8
        # forced on (forks sharing a prompt): every decode step uses cascade; off: none does
        assert (r["cascade_steps"] == r["decode_steps"]) if r["cascade"] else r["cascade_steps"] == 0
    long = report["past_64k_logits"]
    assert long["first_position"] > 1024 and long["top1_agree"] == 1.0  # past the YaRN original context
    assert report["hf"]["tok_s"] > 0 and report["hf"]["engine_vs_hf"] > 0
    params = json.loads((tmp_path / "device_params.json").read_text())["engine"]
    assert {"load_s", "kv_tokens", "decode_tok_s", "hf_generate_tok_s", "engine_vs_hf",
            "decode_tok_s_fp8_e4m3", "kv_tokens_fp8_e4m3"} <= set(params)
    assert set(params["decode_tok_s_fp8_e4m3"]) == {"round1_cascade", "round2_cascade"}
    assert {r["kv_dtype"] for r in rows} == {"float32"}  # the tiny model's own dtype (auto)
    # round 1 and round 2 again with an FP8 cache, as the engine reports it, one byte per K/V value
    fp8 = report["fp8"]
    assert [r["case"] for r in fp8] == ["round1", "round2"]
    for r in fp8:
        assert r["kv_dtype"] == "fp8_e4m3" and r["kv_bytes_per_token"] == 2 * 2 * 2 * 32  # layers x K,V x Hkv x D
        assert r["decode_tok_s"] > 0 and r["decode_vs_auto"] > 0 and r["cascade_steps"] == r["decode_steps"]
