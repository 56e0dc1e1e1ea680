"""The GPU plan's first and last stage (bench/gpu_check.sh).

    python3 -m bench.gpu_summary --preflight     # versions and the device; exit 2 without CUDA
    python3 -m bench.gpu_summary --dry-run       # the same on a CPU host (no device required)
    python3 -m bench.gpu_summary DIR             # the table of what the stages wrote to DIR
"""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path


def preflight(need_cuda: bool) -> int:
    import torch
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "transformers", "pytest"):
        try:
            versions[name] = __import__(name).__version__
        except Exception as e:  # reported, not fatal: the stages that need it say so
            versions[name] = f"missing ({type(e).__name__})"
    print("  ".join(f"{k} {v}" for k, v in versions.items()))
    if not torch.cuda.is_available():
        print("no CUDA device" + ("" if need_cuda else " (dry run: CPU)"))
        return 2 if need_cuda else 0
    free, total = torch.cuda.mem_get_info()
    print(f"{torch.cuda.get_device_name()}: {free / 1e9:.1f} of {total / 1e9:.1f} GB free, "
          f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    return 0


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def table(folder: Path) -> str:
    from bench.gpu_kernels import format_table
    lines = []
    stages = folder / "stages.tsv"
    if stages.is_file():
        rows = [row.split("\t") for row in stages.read_text().splitlines()]
        lines.append("stages: " + ", ".join(f"{name} {'ok' if rc == '0' else 'rc=' + rc} {took}/{limit} s"
                                            for name, rc, took, limit in rows))
    kernels = _load(folder / "gpu_kernels.json")
    if kernels:
        lines.append(f"{kernels['device']} at {kernels['commit']}")
        lines.append(format_table([r for r in kernels["rows"] if "error" not in r]))
        lines += [f"kernels {r['case']} FAILED: {r['error']}" for r in kernels["rows"] if "error" in r]
    e2e = _load(folder / "gpu_e2e.json") or {}
    if "load" in e2e:
        ld = e2e["load"]
        lines.append(f"engine load {ld['load_s']:.1f} s, weights {ld['weights_GB']:.1f} GB, "
                     f"KV {ld['kv_tokens']} tokens ({ld['kv_GB']:.1f} GB)")
    for name, r in (e2e.get("logits") or {}).items():
        lines.append(f"logits vs transformers, {name}: top-1 agree {r['top1_agree']:.3f}, max |diff| "
                     f"{r['max_abs_err']:.3g} of |logit| <= {r['max_abs_logit']:.3g}")
    for r in e2e.get("throughput", []) + e2e.get("fp8", []):
        lines.append(f"{r['case']:9s} cascade={r['cascade']!s:5s} {r['kv_dtype']:9s} "
                     f"decode {r['decode_tok_s']:9.0f} tok/s (end to end {r['e2e_tok_s']:.0f}), "
                     f"{r['decode_ms_per_step']:.1f} ms/step")
    if "past_64k_logits" in e2e:
        r = e2e["past_64k_logits"]
        lines.append(f"past 64k (positions {r['first_position']}..{r['last_position']}) vs transformers: top-1 "
                     f"{r['top1_agree']:.3f}, max |diff| {r['max_abs_err']:.3g}")
    if "hf" in e2e:
        lines.append(f"transformers generate {e2e['hf']['tok_s']:.0f} tok/s; engine round 1 / HF "
                     f"{e2e['hf'].get('engine_vs_hf') or float('nan'):.1f}x")
    lines += [f"e2e {k}: {v}" for k, v in e2e.items() if k.endswith("_error")]
    params = folder / "device_params.json"
    lines.append(f"device model inputs: {params if params.is_file() else 'none written'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--preflight", "--dry-run"):
        return preflight(need_cuda=argv[0] == "--preflight")
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    text = table(Path(argv[0]))
    (Path(argv[0]) / "summary.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
