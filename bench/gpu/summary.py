"""The GPU check's last stage (bench/gpu/check.sh; its first: bench/gpu/preflight.py), and PaCoRe-8B's memory.

    python3 -m bench.gpu.summary DIR                    # the table of what the stages wrote to DIR (summary.txt)
    python3 -m bench.gpu.summary --memory               # PaCoRe-8B's weights and KV tokens per GPU size

The table reads, when present: stages.tsv (with each stage's log), gpu_kernels.json, gpu_spec_kernels.json,
gpu_fp8_gemm.json, gpu_engine_fp8.json, gpu_e2e.json and device_params.json. gpu_fp8_gemm.json (bench/gpu/fp8_gemm.py) is the list of its rows as
it writes them

    [{"shape": "qkv 4096->6144", "scales": "channel", "M": 256, "path": "scaled_mm", "bf16_us": 41.0,
      "fp8_us": 25.0, "speedup": 1.64, "rel_err": 1e-3, "quant_rel_err": 0.02, "pass": true}, ...]

one row per GEMM (M: the rows, i.e. the tokens of the step; speedup: bf16_us / fp8_us; rel_err: against
the FP8 layer's torch reference; "pass" decides, else rel_err <= "tol"); a row with an "error" key is
listed as failed. A dict with the rows under "rows" (and the "device") is read too.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HOST_TARGET = 0.10  # the host's share of a decode step the engine aims under: at or over it, FAIL
# Speculative steps against what the rehearsal prices them at (engine/device_model.py speculation_seconds)
# at the spec section's shape (bench/gpu/e2e.py: 64 rows of ~528 tokens, window 256 + sink 16, depth 3 for
# self-drafting, 4 n-gram drafts), with the calibration's 34% rms error as the margin (docs/rehearsal.md):
# a self-drafting draft step costs 0.69 of a verify step there (at most 0.92 passes), an n-gram verify step
# (5 queries a row) 1.52 plain decode steps (at most 2.03 passes). tests/bench/test_bench_gpu_summary.py
# recomputes both from the device model.
MODEL_ERROR = 0.34
DRAFT_VS_VERIFY_MAX = 0.92
VERIFY_VS_PLAIN_MAX = 2.03
STAGE_REASONS = {"124": "timed out", "137": "killed after its timeout"}


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def fp8_gemm_lines(data) -> list[str]:
    """gpu_fp8_gemm.json's rows (the module docstring's format), one line each with its verdict."""
    rows = data if isinstance(data, list) else data.get("rows", [])
    device = "" if isinstance(data, list) else f" on {data.get('device', '?')}"
    lines = [f"FP8 GEMM (W8A8: torch._scaled_mm per channel, the Triton kernel for block scales) vs bf16{device}; "
             "err: against the FP8 layer's torch reference (its quantization error is not counted)"]
    for r in rows:
        name = str(r.get("shape", "?")) + (f" {r['scales']}" if r.get("scales") else "") + (" graph" if r.get("graph") else "")
        if r.get("error"):
            lines.append(f"fp8 gemm {name} FAILED: {r['error']}")
            continue
        ok = r.get("pass", r.get("passed", r.get("rel_err", float("nan")) <= r.get("tol", 0.0)))
        eager = "" if "same_as_eager" not in r else f"  replay {'==' if r['same_as_eager'] else '!='} eager"
        lines.append(f"fp8 gemm {name:<16} M={r['M']:<6} bf16 {r['bf16_us']:8.1f} us  fp8 {r['fp8_us']:8.1f} us"
                     f"  {r['speedup']:.2f}x  err {r['rel_err']:.1e}{eager}  {'PASS' if ok else 'FAIL'}")
    return lines


def engine_fp8_line(c: dict) -> str:
    """gpu_engine_fp8.json (bench/gpu/engine_check.py fp8_weights): the engine with FP8 weights and graphs."""
    if "error" in c:
        return f"engine {c['name']} FAILED: {c['error']}"
    return (f"engine {c['name']}: {'PASS' if c['passed'] else 'FAIL'} ({c['identical']}/{c['trajectories']} greedy "
            f"trajectories identical, {c['explained_flips']} flips explained by the logits, {len(c['unexplained'])} "
            f"not; max logit diff {c['max_rel_logit_diff']:.1e} of the largest, tolerance {c['tol']:.0e})")


def _step_line(r: dict) -> list[str]:
    """Where a decode step's time went (bench/gpu/step_times.py), and the host's share against HOST_TARGET."""
    out = []
    for kind, s in r.get("steps", {}).items():
        share = s.get("host_share")
        verdict = "" if share is None else f" -> host {share:.1%} of the step " + \
            (f"PASS (< {HOST_TARGET:.0%})" if share < HOST_TARGET else f"FAIL (at or over {HOST_TARGET:.0%})")
        out.append(f"    {kind} step {_ms(s['wall_ms'])} ms: schedule {_ms(s['schedule_ms'])}, prepare "
                   f"{_ms(s['prepare_ms'])}, model {_ms(s['model_ms'])} (GPU {_ms(s['gpu_ms'])}, of it graph replay "
                   f"{_ms(s['replay_ms'])}), sample {_ms(s['sample_ms'])}{verdict}")
    return out


def _spec_verdict(method: str, fw: dict) -> list[str]:
    """The speculative step-time rule (DRAFT_VS_VERIFY_MAX, VERIFY_VS_PLAIN_MAX); none without GPU times."""
    a, b, limit, what = (("draft", "verify", DRAFT_VS_VERIFY_MAX, "a draft step / a verify step") if method == "self_window"
                         else ("verify", "decode", VERIFY_VS_PLAIN_MAX, "a verify step / a plain decode step"))
    x, y = (fw.get(k, {}).get("gpu_ms") for k in (a, b))
    if not x or not y:
        return []
    ok = x / y <= limit
    return [f"    spec {method}: {what} = {x / y:.2f} {'PASS' if ok else 'FAIL'} (at most {limit:.2f}: the rehearsal's "
            f"price + {MODEL_ERROR:.0%})"]


def e2e_lines(e2e: dict) -> list[str]:
    lines = []
    if "load" in e2e:
        ld = e2e["load"]
        lines.append(f"engine load {ld['load_s']:.1f} s (graphs {ld.get('graphs')}), weights {ld['weights_GB']:.1f} GB, "
                     f"KV {ld['kv_tokens']} tokens ({ld['kv_GB']:.1f} GB)")
    lines += [f"CUDA graph capture FAILED ({c['engine']}, ran eagerly): {c['error']}" for c in e2e.get("graph_capture_errors", [])]
    for r in e2e.get("throughput", []) + e2e.get("fp8", []):
        lines.append(f"{r['case']:9s} cascade={r['cascade']!s:5s} graphs={r.get('graphs', '?')!s:5s} {r['kv_dtype']:9s} "
                     f"decode {r['decode_tok_s']:9.0f} tok/s (end to end {r['e2e_tok_s']:.0f}), "
                     f"{r['decode_ms_per_step']:.1f} ms/step")
        lines += _step_line(r)
    for r in e2e.get("spec", []):
        fw = r.get("forwards", {})
        parts = [f"{k} {_ms(v['gpu_ms'])} ms GPU ({v['rows']:.0f} rows, {v['tokens']:.0f} tokens, {v['graphs']}/{v['calls']} "
                 f"from graphs)" for k, v in fw.items()]
        lines.append(f"spec {r['method']:<11} (random weights: step times, not acceptance): " + "; ".join(parts))
        lines += _spec_verdict(r["method"], fw)
        lines += _step_line(r)
    for name in ("logits", "past_64k_logits"):
        c = e2e.get(name)
        if not c:
            continue
        where = "positions past 65,535" if name != "logits" else f"cascade, graphs {c.get('graphs')}"
        lines.append(f"logits vs transformers ({where}): {'PASS' if c['passed'] else 'FAIL'}: top-1 agrees at "
                     f"{c['clear_positions'] - c['clear_mismatches']}/{c['clear_positions']} positions with a clear "
                     f"top-2 margin (> 2x the position's max |diff|; {c['positions']} in all, top-1 agree "
                     f"{c['top1_agree']:.3f}); max |diff| {c['max_rel_err']:.1e} of the largest logit (tolerance "
                     f"{c['tol']:.0e})")
    if "hf" in e2e:
        lines.append(f"transformers generate {e2e['hf']['tok_s']:.0f} tok/s; engine round 1 / HF "
                     f"{e2e['hf'].get('engine_vs_hf') or float('nan'):.1f}x")
    lines += [f"e2e {k}: FAILED {v}" for k, v in e2e.items() if k.endswith("_error")]
    return lines


def _stages(folder: Path) -> list[list[str]]:
    """stages.tsv's rows (name, exit code or "skipped", seconds taken, timeout), the summary's own left out."""
    path = folder / "stages.tsv"
    rows = [r.split("\t") for r in path.read_text().splitlines()] if path.is_file() else []
    return [r + [""] * (4 - len(r)) for r in rows if r and r[0] != "summary"]


def _last_line(log: Path) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    return text[-1][:300] if text else "(no log)"


def stage_lines(folder: Path) -> list[str]:
    """The stages line, then a FAIL row for each stage that did not finish with exit code 0, with its reason:
    skipped (the budget was spent), timed out, or its exit code, and the last line of its log."""
    rows = _stages(folder)
    if not rows:
        return []
    lines = ["stages: " + ", ".join(f"{name} {'ok' if rc == '0' else 'rc=' + rc} {took}/{limit} s"
                                    for name, rc, took, limit in rows)]
    for name, rc, took, limit in rows:
        if rc == "0":
            continue
        if rc == "skipped":
            why = "skipped: the budget (PLAN_S or MORE_S) was spent before it could start"
        else:
            why = (f"{STAGE_REASONS[rc]} after {took} s of its {limit} s" if rc in STAGE_REASONS
                   else f"exited with code {rc} after {took} s")
            why += f"; its log ends: {_last_line(folder / f'{name}.log')}"
        lines.append(f"stage {name} FAIL: {why}")
    return lines


def count_verdicts(lines: list[str]) -> tuple[int, int]:
    """(PASS rows, FAIL rows): a line is one row, FAIL when it says FAIL or FAILED anywhere, else PASS when it
    says PASS."""
    lines = [line for entry in lines for line in entry.splitlines()]  # a kernel table is one entry of many rows
    failed = sum(bool(re.search(r"\bFAIL(ED)?\b", line)) for line in lines)
    passed = sum(bool(re.search(r"\bPASS\b", line)) and not re.search(r"\bFAIL(ED)?\b", line) for line in lines)
    return passed, failed


def exit_code(folder: Path, text: str) -> int:
    """0: every row PASS and every stage finished; 1: a FAIL row; 2: the check did not run (its preflight
    stopped it, or nothing was judged)."""
    rows = {r[0]: r[1] for r in _stages(folder)}
    passed, failed = (int(x) for x in re.search(r"verdicts: (\d+) PASS, (\d+) FAIL", text).groups())
    if rows.get("preflight", "0") != "0" or passed + failed == 0:
        return 2
    return 1 if failed else 0


def table(folder: Path) -> str:
    from bench.gpu.kernels import format_table as kernel_table
    from bench.gpu.spec_kernels import format_table as spec_table
    lines = stage_lines(folder)
    for name, fmt in (("gpu_kernels.json", kernel_table), ("gpu_spec_kernels.json", spec_table)):
        data = _load(folder / name)
        if data:
            lines.append(f"== {data['device']} at {data['commit']}")
            lines.append(fmt([r for r in data["rows"] if "error" not in r], data.get("dtype", "bfloat16")))
            lines += [f"{name} {r['case']} FAILED: {r['error']}" for r in data["rows"] if "error" in r]
    fp8 = _load(folder / "gpu_fp8_gemm.json")
    if fp8:
        lines += fp8_gemm_lines(fp8)
    if (engine_fp8 := _load(folder / "gpu_engine_fp8.json")) is not None:
        lines.append(engine_fp8_line(engine_fp8))
    lines += e2e_lines(_load(folder / "gpu_e2e.json") or {})
    passed, failed = count_verdicts(lines)
    lines.append(f"verdicts: {passed} PASS, {failed} FAIL")
    params = folder / "device_params.json"
    lines.append(f"device model inputs: {params.name if params.is_file() else 'none written'} "
                 "(the rehearsal's --device)")
    return "\n".join(lines)


def memory_table(gib=(24, 40, 48, 80, 94), utilization: float = 0.9) -> str:
    """PaCoRe-8B (Qwen3-8B's shape) with bf16 weights and with FP8 weights (--quantization fp8), each with a
    bf16 and an FP8 KV cache: the memory it takes (GiB throughout) and the KV tokens the default sizing
    leaves, per GPU memory (GiB, as nvidia-smi's total; and the H200 preset), from the engine's device
    model (engine/device_model.py kv_tokens)."""
    from bench.rehearsal.shapes import QWEN3_8B as C
    from engine.device_model import DeviceParams, kv_tokens
    from engine.core.step_shape import ModelShape

    def shape(kv_bytes: int, fp8_weights: bool = False) -> ModelShape:
        return ModelShape(C["num_hidden_layers"], C["hidden_size"], C["intermediate_size"], C["num_attention_heads"],
                          C["num_key_value_heads"], C["head_dim"], C["vocab_size"], 2, qk_norm=True,
                          kv_dtype_bytes=kv_bytes, tie_word_embeddings=C["tie_word_embeddings"], fp8_weights=fp8_weights)
    bf16, fp8 = shape(2), shape(1)
    h200 = DeviceParams()
    gb = 2 ** 30

    def weights(s: ModelShape) -> float:  # the embedding table too (untied), as kv_tokens counts it
        return (s.weight_bytes + s.vocab_size * s.hidden_size * s.dtype_bytes) / gb
    context = C["max_position_embeddings"]
    lines = [f"PaCoRe-8B: weights {weights(bf16):.1f} GiB (bf16), {weights(shape(2, True)):.1f} GiB (FP8 projections, "
             f"--quantization fp8); activation reserve {h200.activation_reserve_bytes / gb:.1f} GiB; KV per token "
             f"{bf16.kv_bytes_per_token:,} B (bf16) / {fp8.kv_bytes_per_token:,} B (fp8)",
             f"one {context:,}-token context: {context * bf16.kv_bytes_per_token / gb:.1f} GiB of KV (bf16), "
             f"{context * fp8.kv_bytes_per_token / gb:.1f} GiB (fp8)",
             f"KV tokens at gpu_memory_utilization={utilization}:",
             f"{'GPU memory':>22} {'bf16 KV':>12} {'fp8 KV':>12} {'FP8 weights,':>14} {'FP8 weights,':>14}",
             f"{'':>22} {'':>12} {'':>12} {'bf16 KV':>14} {'fp8 KV':>14}"]
    devices = [(f"{g} GiB", DeviceParams(memory_bytes=g * gb)) for g in gib]
    devices.append((f"H200 ({h200.memory_bytes / gb:.1f} GiB)", h200))
    for label, dev in devices:
        cells = [kv_tokens(s, dev, utilization) for s in (bf16, fp8, shape(2, True), shape(1, True))]
        lines.append(f"{label:>22} {cells[0]:>12,} {cells[1]:>12,} {cells[2]:>14,} {cells[3]:>14,}")
    return "\n".join(lines)


EXIT_LINES = {0: "exit 0: every check PASS, every stage finished",
              1: "exit 1: FAIL rows above (docs/gpu.md: what to do on each FAIL)",
              2: "exit 2: the check did not run: its preflight stopped it (the stage's log says why) or nothing was judged"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--memory"]:
        print(memory_table())
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    text = table(Path(argv[0]))
    code = exit_code(Path(argv[0]), text)
    text += "\n" + EXIT_LINES[code]
    (Path(argv[0]) / "summary.txt").write_text(text + "\n")
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
