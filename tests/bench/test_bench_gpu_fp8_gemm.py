"""bench.gpu.fp8_gemm --dry-run: the GPU script's code path on CPU (the reference, the Triton block kernel
under the interpreter, tiny shapes), writing the rows bench/gpu/summary.py reads."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_writes_every_row(tmp_path):
    # a subprocess: the interpreter must be on before the kernels are created, whatever this session imported
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.fp8_gemm", "--dry-run", "--engine", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "gpu_fp8_gemm.json").read_text())
    timed, graphs = [r for r in rows if not r.get("graph")], [r for r in rows if r.get("graph")]
    assert {(r["shape"], r["scales"], r["M"]) for r in timed} == {
        (s, sc, m) for s in ("qkv 256->384", "down 384->256") for sc in ("channel", "block128") for m in (1, 5)}
    for r in timed:
        assert {"shape", "M", "bf16_us", "fp8_us", "speedup", "rel_err", "pass"} <= set(r) and "error" not in r
        assert r["pass"] and r["rel_err"] < 1e-5 and 0 < r["quant_rel_err"] < 0.05 and r["fp8_us"] > 0
    assert {r["path"] for r in timed} == {"reference", "triton_block (interpreter)"}
    # each path replayed as a graph would (emulated on a CPU): the replay equals the eager call
    assert {(r["shape"], r["scales"], r["M"], r["path"]) for r in graphs} == {
        (s, sc, 5, p) for s in ("qkv 256->384", "down 384->256")
        for sc, p in (("channel", "reference graph"), ("block128", "triton_block (interpreter) graph"))}
    assert all(r["pass"] and r["same_as_eager"] and r["rel_err"] < 1e-5 for r in graphs)
    # the engine with FP8 weights and its (emulated) decode graphs against the model's dtype
    engine = json.loads((tmp_path / "gpu_engine_fp8.json").read_text())
    assert engine["passed"] and engine["trajectories"] == 4 and 0 < engine["max_rel_logit_diff"] <= engine["tol"] == 0.25
    from bench.gpu.summary import table
    text = table(tmp_path)
    assert "fp8 gemm qkv 256->384 channel graph M=5" in text and "replay == eager  PASS" in text
    assert "engine fp32 fp8 weights + graphs vs float32 + graphs: PASS (4/4 greedy trajectories identical" in text
    assert "verdicts: 13 PASS, 0 FAIL" in text
