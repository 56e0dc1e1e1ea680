"""bench.gpu.spec_kernels --dry-run: the GPU script's code path on CPU (Triton interpreter, tiny shapes)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_writes_every_case(tmp_path):
    # a subprocess: the interpreter must be on before the kernels are created, whatever this session imported
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.spec_kernels", "--dry-run", "--out", str(tmp_path)],
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

    from bench.gpu.common import run_cases
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


def test_the_sparse_check_compares_decode_over_the_same_block_tables():
    """A selection that differs from the reference's (a near-tie broken the other way) is reported as
    such, not as a decode error: both decodes read the Triton selection's tables (issue 52)."""
    from types import SimpleNamespace

    import torch

    from bench.gpu.spec_kernels import sparse_errors
    from pacore_kernels import block_select as bsel
    from pacore_kernels.paged_decode import paged_decode_ref

    torch.manual_seed(0)
    B, Hq, Hkv, D, bs, L = 2, 4, 2, 16, 4, 64
    k, v = torch.randn(2, B * L // bs, bs, Hkv, D).unbind(0)
    bt = torch.arange(B * L // bs, dtype=torch.int32).view(B, L // bs)
    sl, q = torch.full((B,), L, dtype=torch.int32), torch.randn(B, Hq, D)
    bounds = bsel.allocate_key_bounds(1, k.shape[0], Hkv, D, torch.float32, "cpu")[0]
    bsel.update_key_bounds(bounds, k.flatten(0, 1), torch.arange(k.shape[0] * bs), bs)
    spans = (1, 2, 2)

    def other_choice(q, bounds, bt, sl, bs, *spans):  # the reference's selection, but one block swapped
        tables, lens = bsel.select_blocks_ref(q, bounds, bt, sl, bs, *spans)
        tables = tables.clone()
        tables[:, 1] = bt[:, 2] if not bool((tables[:, 1] == bt[:, 2]).all()) else bt[:, 3]
        return tables, lens
    kernels = SimpleNamespace(paged_decode_ref=paged_decode_ref, paged_decode_triton=lambda *a, **kw: paged_decode_ref(
        a[0].float(), *a[1:], **kw))
    err, same = sparse_errors(kernels, SimpleNamespace(select_blocks_triton=other_choice,
                                                       select_blocks_ref=bsel.select_blocks_ref),
                              q, k, v, bounds, bt, sl, bs, spans, 0.25, 1.0, 1.0)
    assert err < 1e-6 and 0 < same < 1
