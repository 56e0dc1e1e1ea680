"""bench.gpu_spec_kernels --dry-run: the GPU script's code path on CPU (Triton interpreter, tiny shapes)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_writes_every_case(tmp_path):
    # a subprocess: the interpreter must be on before the kernels are created, whatever this session imported
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_spec_kernels", "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "gpu_spec_kernels.json").read_text())["rows"]
    assert not [r for r in rows if "error" in r]
    key = {(r["case"], r["kv_dtype"], r.get("context"), r.get("q_len")) for r in rows}
    assert {("verify", f, L, q) for f in ("auto", "fp8_e4m3") for L in (40, 70) for q in (1, 3, 5)} <= key
    assert {("cascade", f, None, q) for f in ("auto", "fp8_e4m3") for q in (1, 5)} <= key
    assert {("draft", f, 70, None) for f in ("auto", "fp8_e4m3")} <= key
    assert {("sparse", f, 70, None) for f in ("auto", "fp8_e4m3")} <= key
    assert {("importance", f, 70, 5) for f in ("auto", "fp8_e4m3")} <= key
    assert [(r["B"], r["same_tokens_as_ref"]) for r in rows if r["case"] == "sample"] == [(4, 4)]
    for r in rows:  # the kernels agree with the fp32 reference, and every timed row has its bandwidth
        assert r["rel_err_vs_fp32"] < 1e-4 and r["us"] > 0 and r["GBps"] > 0
    ratios = json.loads((tmp_path / "device_params.json").read_text())["spec_verify_time_over_plain"]
    assert set(ratios) == {"auto", "fp8_e4m3"} and ratios["auto"]["L70_q1"] == 1.0
    assert "sink 4 + window 16" in (tmp_path / "gpu_spec_kernels_table.txt").read_text()


def test_run_cases_frees_the_gpu_cache_between_cases(monkeypatch):
    """On a GPU run_cases empties the CUDA cache after each case (a dry run never takes that branch)."""
    import torch

    from bench.gpu_common import run_cases
    freed = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(1))

    class Bench:
        dev, dtype, rows = "cuda", "bfloat16", []

        def add(self, row):
            self.rows.append(row)
    b = Bench()
    cases = {"a": lambda bench, k: bench.add({"case": "a"}), "b": lambda bench, k: 1 / 0}
    assert run_cases(b, None, cases, lambda rows, dtype: f"{len(rows)} {dtype} rows", None) == 1
    assert freed == [1, 1] and b.rows[-1]["error"].startswith("ZeroDivisionError")
