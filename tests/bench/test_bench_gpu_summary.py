"""bench/gpu_summary.py: the GPU check's table (verdicts, the optional FP8 GEMM rows) and PaCoRe-8B's memory."""
import json

from bench.gpu_common import verdict
from bench.gpu_summary import main, memory_table, table


def test_kernel_rows_pass_within_their_dtypes_tolerance_and_fail_beyond():
    assert verdict({"case": "paged", "rel_err_vs_fp32": 5e-3}, "bfloat16") == "PASS"
    assert verdict({"case": "paged", "rel_err_vs_fp32": 5e-3}, "float32").startswith("FAIL")
    assert verdict({"case": "prefill", "whole_128x64_rel_err_vs_fp32": 1e-3, "sdpa_rel_err_vs_fp32": float("nan")},
                   "bfloat16").startswith("FAIL")  # any column, NaN included
    assert verdict({"case": "sample", "B": 4, "same_tokens_as_ref": 3, "rel_err_vs_fp32": 0.0}, "bfloat16") != "PASS"
    assert verdict({"case": "copy", "copy_bw_GBps": 4000.0}, "bfloat16") == ""  # nothing to judge


def test_the_table_counts_verdicts_and_reads_the_fp8_gemm_rows(tmp_path):
    kernels = dict(device="GPU", commit="c0ffee", dtype="bfloat16", rows=[
        dict(case="copy", copy_bw_GBps=4000.0, matmul_tflops=700.0),
        dict(case="paged", kv_dtype="auto", B=32, context=16384, us=90.0, bw_frac=0.8, rel_err_vs_fp32=4e-3),
        dict(case="paged", kv_dtype="auto", B=4, context=65536, us=50.0, bw_frac=0.7, rel_err_vs_fp32=0.3)])
    (tmp_path / "gpu_kernels.json").write_text(json.dumps(kernels))
    fp8 = [  # as bench/gpu_fp8_gemm.py writes it
        dict(shape="qkv_proj", M=256, bf16_us=41.0, fp8_us=25.0, speedup=1.64, rel_err=0.01, **{"pass": True}),
        dict(shape=[12288, 4096], M=8, bf16_us=30.0, fp8_us=20.0, speedup=1.5, rel_err=0.2, tol=0.05),
        dict(shape="down_proj", scales="block128", M=1, bf16_us=30.0, fp8_us=None, speedup=None, rel_err=None,
             error="RuntimeError: no FP8 on this device", **{"pass": False})]
    (tmp_path / "gpu_fp8_gemm.json").write_text(json.dumps(fp8))
    text = table(tmp_path)
    assert "B=32   ctx=16384" in text and "err 4.0e-03  PASS" in text and "err 3.0e-01  FAIL" in text
    assert "fp8 gemm qkv_proj         M=256" in text and "1.64x  err 1.0e-02  PASS" in text
    assert "fp8 gemm [12288, 4096]" in text and "err 2.0e-01  FAIL" in text  # no "passed": rel_err <= tol decides
    assert "fp8 gemm down_proj block128 FAILED: RuntimeError" in text
    assert "verdicts: 2 PASS, 3 FAIL" in text and "device model inputs: none written" in text
    assert main([str(tmp_path)]) == 0 and (tmp_path / "summary.txt").read_text() == text + "\n"


def test_memory_table_is_the_device_models_sizing():
    from engine.device_model import DeviceParams, kv_tokens
    from engine.step_shape import ModelShape
    text = memory_table(gib=(80,))
    assert "weights 16.4 GB (bf16)" in text and "KV per token 147,456 B (bf16) / 73,728 B (fp8)" in text
    shape = ModelShape(36, 4096, 12288, 32, 8, 128, 151936, 2, qk_norm=True, kv_dtype_bytes=1)
    assert f"{kv_tokens(shape, DeviceParams(memory_bytes=80 * 2 ** 30)):,}" in text.splitlines()[-2]
