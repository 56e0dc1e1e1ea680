"""A smoke test of a downloaded PaCoRe-8B (or any Qwen3, Qwen2 or Llama folder): does this engine run the
user's own checkpoint, and compute what transformers computes? Separate from the GPU check, whose weights
are random (bench/gpu/check.sh); docs/gpu.md, "Your own PaCoRe-8B".

    python3 -m bench.gpu.smoke --model /path/to/PaCoRe-8B [--out DIR]

For each weight format, bf16 and then FP8 (--quantization fp8, quantized at load: no FP8 PaCoRe-8B is
published):
1. one problem through `pacore run` at a small budget (--preset low --max-tokens 256, greedy): it must
   exit 0 and write its one result line without an error (a 256-token budget rarely finishes the
   reasoning, so the answer is not judged);
2. the engine as `pacore run` loads it (CUDA graphs, the default kernels) decodes STEPS tokens of the same
   prompt greedily, and the logits each token was chosen from are compared with transformers' own forward
   of the checkpoint in bf16 on the same GPU, teacher-forced on the engine's tokens
   (bench/gpu/logits.py logits_check): every position's largest |logit difference| within the tolerance of
   its largest logit, and the engine's token transformers' top-1 wherever the top-2 margin is clear
   (above twice that difference). The tolerance: 5e-2 in bf16 (the GPU check's rule); 0.25 with FP8
   weights, the bound documented for FP8 weights against the model's dtype (tests/engine/test_fp8_weights.py).
PASS when every part passes for both formats: exit 0; a FAIL exits 1. Engines and transformers' model are
loaded one at a time. On a CPU (--device cpu --dtype float32) the same code path runs a tiny model (the
test: tests/bench/test_bench_gpu_smoke.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBLEM = {"id": "smoke", "ground_truth": {"answer": "408"},
           "messages": [{"role": "user", "content": "What is 17 * 24? Put the final answer in \\boxed{}."}]}
TOL = {"bf16": None, "fp8": 0.25}  # None: bench/gpu/logits.py TOL of the dtype


def pacore_run(model: str, dtype: str, fp8: bool, max_tokens: int, work: Path) -> dict:
    """`pacore run` on PROBLEM: exit code, seconds, and whether its result line came back without an error."""
    data, out = work / "problem.jsonl", work / f"results-{'fp8' if fp8 else 'bf16'}.jsonl"
    data.write_text(json.dumps(PROBLEM) + "\n")
    cmd = [sys.executable, "-m", "pacore", "run", "--model", model, "--data", str(data), "--out", str(out),
           "--preset", "low", "--max-tokens", str(max_tokens), "--temperature", "0", "--dtype", dtype]
    cmd += ["--quantization", "fp8"] if fp8 else []
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [json.loads(x) for x in out.read_text().splitlines()] if out.is_file() else []
    ok = proc.returncode == 0 and len(lines) == 1 and "error" not in lines[0]
    return dict(command=" ".join(cmd), returncode=proc.returncode, seconds=time.perf_counter() - t, passed=ok,
                result_lines=len(lines), log_tail=(proc.stdout + proc.stderr)[-1500:])


def prompt_ids(model: str) -> list[int]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model)
    text = tok.apply_chat_template(PROBLEM["messages"], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False).input_ids


def engine_rows(model: str, device: str, dtype: str, fp8: bool, prompt: list[int], steps: int):
    """The engine's greedy tokens and the logits each came from (its default settings: graphs on CUDA)."""
    from bench.gpu.logits import engine_logits
    from engine import LLM
    with LLM(model, device=device, dtype=dtype, quantization="fp8" if fp8 else None) as llm:
        (_, tokens, rows), = engine_logits(llm, [prompt], 1, steps)
    return tokens, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the checkpoint folder (config.json, safetensors, tokenizer)")
    ap.add_argument("--out", default=None, help="folder for gpu_smoke.json (default: a new temporary folder)")
    ap.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    ap.add_argument("--dtype", default=None, help="bfloat16 (default on CUDA) or float32 (default on a CPU)")
    ap.add_argument("--formats", default="bf16,fp8", help="weight formats to check, of bf16,fp8")
    ap.add_argument("--max-tokens", type=int, default=256, help="pacore run's budget per trajectory")
    ap.add_argument("--steps", type=int, default=32, help="greedy steps compared with transformers")
    args = ap.parse_args(argv)
    import torch

    from bench.gpu.logits import TOL as DTYPE_TOL
    from bench.gpu.logits import hf_model, hf_teacher_forced, logits_check
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    formats = args.formats.split(",")
    if not formats or set(formats) - set(TOL):
        ap.error(f"--formats takes bf16 and fp8, got {args.formats!r}")
    work = Path(args.out or tempfile.mkdtemp(prefix="pacore_smoke_"))
    work.mkdir(parents=True, exist_ok=True)
    report, t0 = dict(model=args.model, device=device, dtype=dtype, formats={}), time.perf_counter()
    prompt = prompt_ids(args.model)
    decoded = {}
    for fmt in formats:  # pacore run first (its own process), then the engine's rows: one model loaded at a time
        run = pacore_run(args.model, dtype, fmt == "fp8", args.max_tokens, work)
        print(f"pacore run ({fmt}): {'PASS' if run['passed'] else 'FAIL'} in {run['seconds']:.0f} s", flush=True)
        decoded[fmt] = engine_rows(args.model, device, dtype, fmt == "fp8", prompt, args.steps)
        report["formats"][fmt] = dict(pacore_run=run)
        if device == "cuda":
            torch.cuda.empty_cache()
    model = hf_model(args.model, dtype, device)
    for fmt, (tokens, rows) in decoded.items():
        check = logits_check(rows, tokens, hf_teacher_forced(model, prompt, tokens), TOL[fmt] or DTYPE_TOL[dtype])
        report["formats"][fmt]["logits"] = check
        print(f"logits vs transformers ({fmt} weights, {len(tokens)} steps): {'PASS' if check['passed'] else 'FAIL'}: "
              f"max |diff| {check['max_rel_err']:.1e} of the largest logit (tolerance {check['tol']:.0e}), top-1 "
              f"agrees at {check['clear_positions'] - check['clear_mismatches']}/{check['clear_positions']} clear "
              f"positions", flush=True)
    del model
    passed = all(f["pacore_run"]["passed"] and f["logits"]["passed"] for f in report["formats"].values())
    report.update(passed=passed, seconds=time.perf_counter() - t0)
    (work / "gpu_smoke.json").write_text(json.dumps(report, indent=1))
    print(f"smoke test of {args.model}: {'PASS' if passed else 'FAIL'} in {report['seconds']:.0f} s "
          f"({work / 'gpu_smoke.json'})")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
