"""How many Triton compiles the kernel tests make on a GPU, counted on a CPU.

The tests run under the interpreter while every launch's compile key is recorded as the CUDA
launcher would compute it (tests/_triton_env.py record_compile_keys); the distinct keys per kernel
are the compiles a GPU run of the same tests makes (test_kernels_compile and
test_kernels_specialization are left out: a GPU skips them). The GPU plan (bench/gpu/check.sh,
bench/gpu/kernel_tests.py) runs the kernel tests with a GPU's defaults: bf16 and fp16
(tests/_triton_env.py), on a GPU's case grid (env.grid), which --cpu-grid replaces with the CPU's.

    python tests/pacore_kernels/compile_count.py [--dtypes bfloat16,float16] [-- extra pytest args]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bfloat16,float16", help="PACORE_TEST_DTYPES of the counted run")
    ap.add_argument("--cpu-grid", action="store_true", help="every case for every dtype, as on a CPU")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)
    os.environ.update(PACORE_TEST_DEVICE="cpu", PACORE_TEST_DTYPES=args.dtypes,
                      PACORE_TEST_GRID="cpu" if args.cpu_grid else "gpu")
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import pytest

    import _triton_env as env
    seen: dict[str, set] = {}

    class Count:
        @staticmethod
        def pytest_configure(config):
            env.record_compile_keys(setattr, seen)

    tests = sorted(str(p) for p in (ROOT / "tests/pacore_kernels").glob("test_kernels_*.py")
                   if p.stem not in ("test_kernels_compile", "test_kernels_specialization"))
    rc = pytest.main([*tests, "-q", "-p", "no:cacheprovider", *args.pytest_args], plugins=[Count()])
    print(f"compiles a GPU run of the kernel tests makes (dtypes {args.dtypes}, "
          f"{'CPU' if args.cpu_grid else 'GPU'} case grid):")
    for name, keys in sorted(seen.items()):
        print(f"  {name:28s} {len(keys)}")
    print(f"  {'total':28s} {sum(len(k) for k in seen.values())}")
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
