"""What the GPU check's scripts share (bench/gpu/kernels.py, bench/gpu/spec_kernels.py, bench/gpu/e2e.py):
the commit, device_params.json, the error against a reference and its verdict, and the loop over cases."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# A kernel's max |out - ref| / max |ref| against the fp32 reference, by the dtype it ran in: bf16 rounds
# q, p and the output to 8 bits of mantissa (~4e-3 each), so 2e-2 is a 5x margin that a wrong mask or
# a missed block (errors of order 1) still fails; fp32 (the CPU dry run) differs by summation order only.
REL_TOL = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def write_device_params(out: str | None, **params) -> None:
    """Merge params into OUT/device_params.json, the device model's inputs (both GPU scripts add theirs,
    stage by stage)."""
    if not out:
        return
    path = Path(out) / "device_params.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps(_merged(data, params), indent=1))


def _merged(old, new):
    """new laid over old, dicts merged at every depth (stages add their entries to one file)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _merged(old.get(k), v) for k, v in new.items()}}
    return new


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def verdict(row: dict, dtype: str) -> str:
    """"PASS" or "FAIL" of a row's errors against the fp32 reference (each key ending rel_err_vs_fp32) at
    REL_TOL[dtype], and of its exactness flags (stored_exactly, same tokens as the reference); "" when
    the row has none."""
    errs = [v for k, v in row.items() if k.endswith("rel_err_vs_fp32") and isinstance(v, (int, float))]
    flags = [row[k] for k in ("stored_exactly",) if k in row]
    if "same_tokens_as_ref" in row:
        flags.append(row["same_tokens_as_ref"] == row["B"])
    if not errs and not flags:
        return ""
    ok = all(e <= REL_TOL[dtype] for e in errs) and all(flags)  # a NaN error fails
    return "PASS" if ok else f"FAIL (tolerance {REL_TOL[dtype]:.0e})"


def open_kernels(tiny: bool, script: str, dry_flag: str):
    """The kernels package, under the interpreter for a dry run (switched on before triton or the kernels
    import); None, having said why, when a real run finds no CUDA device."""
    if tiny:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import pacore_kernels
    if not tiny and not torch.cuda.is_available():
        print(f"{script}: no CUDA device (use {dry_flag} on CPU)", file=sys.stderr)
        return None
    return pacore_kernels


def run_cases(bench, kernels, cases: dict, format_table, table_file: Path | None) -> int:
    """Run each case (name -> fn(bench, kernels)); a failing case is recorded and the others still run.
    Prints the table of the rows that worked (and writes it to table_file); 1 if any case failed."""
    import torch
    status = 0
    for name, case in cases.items():
        try:
            case(bench, kernels)
        except Exception as e:  # one failing case must not cost the others' numbers
            status = 1
            bench.add(dict(case=name, error=f"{type(e).__name__}: {e}"[:500]))
        if bench.dev == "cuda":
            torch.cuda.empty_cache()
    table = format_table([r for r in bench.rows if "error" not in r], str(bench.dtype).removeprefix("torch."))
    if table_file is not None:
        table_file.write_text(table + "\n")
    print(table)
    return status
