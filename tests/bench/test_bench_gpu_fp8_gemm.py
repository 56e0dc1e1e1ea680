"""bench.gpu_fp8_gemm --dry-run: the GPU script's code path on CPU (the reference, the Triton block kernel
under the interpreter, tiny shapes), writing the rows bench/gpu_summary.py reads."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_writes_every_row(tmp_path):
    # a subprocess: the interpreter must be on before the kernels are created, whatever this session imported
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_fp8_gemm", "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "gpu_fp8_gemm.json").read_text())
    assert {(r["shape"], r["scales"], r["M"]) for r in rows} == {
        (s, sc, m) for s in ("qkv 256->384", "down 384->256") for sc in ("channel", "block128") for m in (1, 5)}
    for r in rows:
        assert {"shape", "M", "bf16_us", "fp8_us", "speedup", "rel_err", "pass"} <= set(r) and "error" not in r
        assert r["pass"] and r["rel_err"] < 1e-5 and 0 < r["quant_rel_err"] < 0.05 and r["fp8_us"] > 0
    assert {r["path"] for r in rows} == {"reference", "triton_block (interpreter)"}
