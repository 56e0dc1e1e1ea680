"""bench/gpu/summary.py: the GPU check's table (verdicts, the optional FP8 GEMM rows) and PaCoRe-8B's memory."""
import json

from bench.gpu.common import verdict
from bench.gpu.summary import main, memory_table, table


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
    fp8 = [  # as bench/gpu/fp8_gemm.py writes it
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
    assert main([str(tmp_path)]) == 1  # FAIL rows
    assert (tmp_path / "summary.txt").read_text() == text + "\nexit 1: FAIL rows above (docs/gpu.md: what to do on each FAIL)\n"


def test_memory_table_is_the_device_models_sizing():
    from engine.device_model import DeviceParams, kv_tokens
    from engine.core.step_shape import ModelShape
    text = memory_table(gib=(80,))
    assert "weights 15.3 GiB (bf16), 8.8 GiB (FP8 projections" in text and "147,456 B (bf16) / 73,728 B (fp8)" in text
    assert "GB" not in text.replace("GiB", "")  # one unit
    assert "H200 (140.4 GiB)      795,142    1,590,284        842,208      1,684,416" in text  # docs/gpu.md's figures
    shape = ModelShape(36, 4096, 12288, 32, 8, 128, 151936, 2, qk_norm=True, kv_dtype_bytes=1)
    assert f"{kv_tokens(shape, DeviceParams(memory_bytes=80 * 2 ** 30)):,}" in text.splitlines()[-2]


def _step(gpu_ms, wall_ms, share):
    return dict(wall_ms=wall_ms, schedule_ms=0.1, prepare_ms=0.2, model_ms=wall_ms - 0.5, gpu_ms=gpu_ms, replay_ms=gpu_ms,
                sample_ms=0.2, host_share=share)


def _forward(gpu_ms):
    return dict(gpu_ms=gpu_ms, rows=64, tokens=64, graphs=10, calls=10)


def test_every_stage_that_did_not_finish_is_a_fail_row_and_the_exit_code_says_so(tmp_path):
    """A synthetic results folder: stages that timed out, crashed, were killed or skipped each count as a FAIL
    row with its reason (they wrote no verdicts of their own), and the exit code is 1."""
    (tmp_path / "stages.tsv").write_text("preflight\t0\t3\t15\nkernels_decode\t124\t85\t85\nspec_kernels\t1\t4\t55\n"
                                         "prefill\t137\t55\t50\nfp8_gemm\tskipped\t0\t0\nsummary\t0\t1\t15\n")
    (tmp_path / "spec_kernels.log").write_text("compiling\nRuntimeError: CUDA error: an illegal memory access\n")
    kernels = dict(device="GPU", commit="c0ffee", dtype="bfloat16", rows=[
        dict(case="paged", kv_dtype="auto", B=32, context=16384, us=90.0, bw_frac=0.8, rel_err_vs_fp32=4e-3)])
    (tmp_path / "gpu_kernels.json").write_text(json.dumps(kernels))
    text = table(tmp_path)
    assert "stage kernels_decode FAIL: timed out after 85 s of its 85 s; its log ends: (no log)" in text
    assert ("stage spec_kernels FAIL: exited with code 1 after 4 s; its log ends: RuntimeError: CUDA error: an "
            "illegal memory access") in text
    assert "stage prefill FAIL: killed after its timeout after 55 s of its 50 s" in text
    assert "stage fp8_gemm FAIL: skipped: the budget" in text and "stage summary" not in text
    assert "verdicts: 1 PASS, 4 FAIL" in text
    assert main([str(tmp_path)]) == 1
    assert (tmp_path / "summary.txt").read_text().rstrip().endswith("exit 1: FAIL rows above (docs/gpu.md: what to "
                                                                    "do on each FAIL)")


def test_exit_0_only_when_everything_passed_and_2_when_the_check_did_not_run(tmp_path):
    kernels = dict(device="GPU", commit="c0ffee", dtype="bfloat16", rows=[
        dict(case="paged", kv_dtype="auto", B=32, context=16384, us=90.0, bw_frac=0.8, rel_err_vs_fp32=4e-3)])
    (tmp_path / "gpu_kernels.json").write_text(json.dumps(kernels))
    (tmp_path / "stages.tsv").write_text("preflight\t0\t3\t15\nkernels_decode\t0\t40\t85\n")
    assert main([str(tmp_path)]) == 0
    (tmp_path / "stages.tsv").write_text("preflight\t2\t3\t15\n")  # no CUDA, or a broken import: nothing ran
    assert main([str(tmp_path)]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2  # nothing judged


def test_speculative_and_host_share_rows_carry_verdicts(tmp_path):
    def spec(method, forwards, share):
        return dict(method=method, forwards=forwards, steps={"spec": _step(9.0, 10.0, share)})
    e2e = dict(spec=[spec("self_window", {"draft": _forward(5.0), "verify": _forward(8.0)}, 0.05),
                     spec("ngram", {"verify": _forward(12.0), "decode": _forward(4.8)}, 0.15)])
    (tmp_path / "gpu_e2e.json").write_text(json.dumps(e2e))
    text = table(tmp_path)
    assert "spec self_window: a draft step / a verify step = 0.62 PASS (at most 0.92" in text
    assert "spec ngram: a verify step / a plain decode step = 2.50 FAIL (at most 2.03" in text
    assert "host 5.0% of the step PASS (< 10%)" in text and "host 15.0% of the step FAIL (at or over 10%)" in text
    assert "verdicts: 2 PASS, 2 FAIL" in text


def test_the_speculative_limits_are_the_rehearsals_prices_plus_its_error():
    """DRAFT_VS_VERIFY_MAX and VERIFY_VS_PLAIN_MAX from the device model at bench/gpu/e2e.py's spec shape."""
    from bench.gpu.summary import DRAFT_VS_VERIFY_MAX, MODEL_ERROR, VERIFY_VS_PLAIN_MAX
    from engine.device_model import DeviceParams, DraftRead, speculation_seconds
    from engine.core.step_shape import ModelShape
    shape = ModelShape(36, 4096, 12288, 32, 8, 128, 151936, 2, qk_norm=True, kv_dtype_bytes=2)
    seconds = speculation_seconds(shape, DeviceParams(), DraftRead(256, 16))
    ctx = [512 + 16] * 64  # 2 problems x 32, 512-token prompts, half of the 32 generated tokens
    draft, verify = seconds(ctx, 3)
    _, verify4 = seconds(ctx, 4)
    _, plain = seconds(ctx, 0)
    assert round(draft / verify * (1 + MODEL_ERROR), 2) == DRAFT_VS_VERIFY_MAX
    assert round(verify4 / plain * (1 + MODEL_ERROR), 2) == VERIFY_VS_PLAIN_MAX


def test_the_documented_memory_table_is_this_commands():
    """docs/gpu.md's memory table, in GiB, is `python3 -m bench.gpu.summary --memory`'s."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs" / "gpu.md").read_text()
    documented = re.findall(r"^\| ([\d.]+) GiB[^|]* \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|$", page, re.M)
    computed = re.findall(r"^ *(?:H200 \()?([\d.]+) GiB\)? +([\d,]+) +([\d,]+) +([\d,]+) +([\d,]+)$", memory_table(), re.M)
    assert len(documented) == 6 and documented == computed
