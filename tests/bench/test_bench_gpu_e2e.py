"""bench.gpu_e2e --tiny: the GPU end-to-end script's code path on CPU (random model, both settings)."""
import json

from bench.gpu_e2e import main


def test_tiny_runs_both_settings(tmp_path):
    assert main(["--tiny", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gpu_e2e.json").read_text())["rows"]
    assert {(r["prompt_len"], r["k"], r["cascade"]) for r in rows} == {(64, 4, True), (64, 4, False),
                                                                       (48, 3, True), (48, 3, False)}
    for r in rows:
        assert r["gen_tokens"] == 2 * r["k"] * 8 and r["decode_tok_s"] > 0
        # Forced on: every decode step after the fork uses cascade; forced off: none does.
        assert (r["cascade_steps"] == r["decode_steps"]) if r["cascade"] else r["cascade_steps"] == 0
    assert "cascade/paged" in (tmp_path / "gpu_e2e_table.txt").read_text()


def test_tiny_runs_with_an_fp8_cache(tmp_path):
    assert main(["--tiny", "--out", str(tmp_path), "--kv-cache-dtype", "fp8_e4m3"]) == 0
    data = json.loads((tmp_path / "gpu_e2e_fp8_e4m3.json").read_text())
    assert data["kv_cache_dtype"] == "fp8_e4m3" and all(r["decode_tok_s"] > 0 for r in data["rows"])
    assert "KV fp8_e4m3" in (tmp_path / "gpu_e2e_fp8_e4m3_table.txt").read_text()
