"""The kernel tests on a GPU, in parallel pytest processes (bench/gpu/check.sh's kernel_tests stage).

Compiling the Triton specialisations takes most of their time (148 on a GPU: tests/pacore_kernels/compile_count.py)
and a compile is one CPU core's work, so the test files run in GROUPS processes at once (the GPU machine
has 16 cores; the kernels are small, one GPU serves them all). Each writes its own -v log to --out
(a test's PASSED / FAILED line as soon as it ran, so a timeout keeps them), and the failures are printed
at the end. No -x: one failure must not hide the others. The files only a GPU can check first (the FP8
store's rounding, the bf16 MMA of paged decode) lead the first group.

    python3 -m bench.gpu.kernel_tests [--out DIR] [--device cuda|cpu] [FILE ...]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Test files (tests/pacore_kernels/test_kernels_<name>.py) per process, about even in compiles; files not named
# here join the last group.
GROUPS = [["store", "paged_decode"], ["cascade", "cascade_plan"], ["prefill", "pointwise", "ref"], ["multi_query"]]


def groups_of(files: list[str]) -> list[list[str]]:
    """The given files (default: every kernel test file) split into GROUPS, in their order; empty ones dropped."""
    if not files:
        files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/pacore_kernels").glob("test_kernels_*.py"))
    name = {f: Path(f).stem.removeprefix("test_kernels_") for f in files}
    out = [[f for g in group for f in files if name[f] == g] for group in GROUPS]
    out[-1] += [f for f in files if not any(name[f] in group for group in GROUPS)]
    return [g for g in out if g]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for the logs")
    ap.add_argument("--device", default="cuda", help="PACORE_TEST_DEVICE of the tests (cpu: the interpreter)")
    ap.add_argument("files", nargs="*", help="test files (default: tests/pacore_kernels/test_kernels_*.py)")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PACORE_TEST_DEVICE": args.device}
    runs = []
    for i, files in enumerate(groups_of(args.files)):
        log = out / f"kernel_tests_{i}.log"
        cmd = [sys.executable, "-m", "pytest", *files, "-v", "-rf", "-p", "no:cacheprovider", "--noconftest"]
        with log.open("w") as f:  # the same process group: a stage's `timeout` stops these too
            runs.append((files, log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)))
    status = 0
    for files, log, proc in runs:
        rc = proc.wait()
        lines = log.read_text().splitlines()
        print(f"{' '.join(Path(f).stem for f in files)}: {lines[-1] if lines else 'no output'} (exit {rc})", flush=True)
        for line in lines:
            if line.startswith("FAILED"):
                print(f"  {line}", flush=True)
        status |= rc not in (0, 5)  # 5: nothing collected (every test skipped by its device)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
