"""bench/gpu/smoke.py, the smoke test of a user's downloaded checkpoint: its whole code path on a tiny random
Qwen3 on a CPU (pacore run in both weight formats, the engine's logits against transformers'), and a wrong
engine failing it."""
import json

from bench.gpu import smoke as gpu_smoke
from bench.gpu.checkpoint import TINY, write_random_model


def test_the_smoke_test_passes_a_tiny_qwen3_on_cpu(tmp_path):
    model = write_random_model(tmp_path / "qwen3", TINY, dtype="float32")
    out = tmp_path / "out"
    assert gpu_smoke.main(["--model", str(model), "--out", str(out), "--device", "cpu", "--dtype", "float32",
                           "--max-tokens", "8", "--steps", "6"]) == 0
    report = json.loads((out / "gpu_smoke.json").read_text())
    assert report["passed"] and set(report["formats"]) == {"bf16", "fp8"}
    for fmt, tol in (("bf16", 1e-3), ("fp8", 0.25)):
        part = report["formats"][fmt]
        assert part["pacore_run"]["passed"] and part["pacore_run"]["result_lines"] == 1
        assert part["pacore_run"]["command"].endswith("--quantization fp8") == (fmt == "fp8")
        assert part["logits"]["passed"] and part["logits"]["positions"] == 6 and part["logits"]["tol"] == tol
    assert report["formats"]["bf16"]["logits"]["max_rel_err"] < 1e-4  # the same model, fp32 both sides
    assert report["formats"]["fp8"]["logits"]["max_rel_err"] > 1e-3  # FP8 weights differ, within the bound


def test_logits_from_another_model_fail_it(tmp_path, monkeypatch):
    model = write_random_model(tmp_path / "qwen3", TINY, dtype="float32")
    other = write_random_model(tmp_path / "other", TINY, dtype="float32", seed=1)
    real = gpu_smoke.engine_rows
    monkeypatch.setattr(gpu_smoke, "engine_rows", lambda m, *a: real(str(other), *a))  # an engine computing wrongly
    monkeypatch.setattr(gpu_smoke, "pacore_run", lambda *a: dict(passed=True, seconds=0.0))
    assert gpu_smoke.main(["--model", str(model), "--out", str(tmp_path / "out"), "--device", "cpu",
                           "--formats", "bf16", "--steps", "4"]) == 1
    assert not json.loads((tmp_path / "out" / "gpu_smoke.json").read_text())["formats"]["bf16"]["logits"]["passed"]
