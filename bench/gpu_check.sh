#!/usr/bin/env bash
# GPU checks for kernels/: run on a CUDA machine where torch and triton are already installed
# (this script installs nothing).
#
#   bench/gpu_check.sh             kernel tests on the GPU (fp32 + bf16 + fp16), the engine's tokens
#                                  through Triton + CUDA graphs vs the torch path, kernel benchmarks,
#                                  then the engine's end-to-end numbers when bench/gpu_e2e.py exists
#   bench/gpu_check.sh --dry-run   CPU only: the benchmark's code path at tiny shapes under the
#                                  Triton interpreter (checks that it executes, no numbers)
#
# $OUT (optional): folder that receives the full numbers (json + logs). The short table prints last.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}  # the GPU machine has python3 only
# Compiled kernels go to an ignored folder of the repo, so a second command on the same machine reuses them.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.triton-cache}
OUT_DIR=${OUT:-}
[ -n "$OUT_DIR" ] && mkdir -p "$OUT_DIR"
TABLE_DIR=${OUT_DIR:-$(mktemp -d)}
status=0
HAVE_PYTEST=1
$PY -c "import pytest" 2>/dev/null || { HAVE_PYTEST=0; echo "pytest does not import: the kernel tests are skipped"; }


if [ "${1:-}" = "--dry-run" ]; then
    TRITON_INTERPRET=1 $PY -m bench.gpu_kernels --dry-run --out "$TABLE_DIR" >/dev/null || exit 1
    echo "dry run OK"
    cat "$TABLE_DIR/gpu_kernels_table.txt"
    exit 0
fi

$PY - <<'PY' || exit 2
import torch, triton
assert torch.cuda.is_available(), "no CUDA device"
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
PY

if [ "$HAVE_PYTEST" = 1 ]; then
    echo "== kernel tests on the GPU (fp32 + bf16 + fp16)"
    PACORE_TEST_DEVICE=cuda PACORE_TEST_DTYPES=bfloat16,float16 \
        $PY -m pytest tests/test_kernels_*.py -q -p no:cacheprovider --noconftest 2>&1 | tee ${OUT_DIR:+"$OUT_DIR/gpu_tests.log"} \
        | tail -n 30
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

echo "== engine on the GPU: triton + CUDA graphs vs torch references (greedy tokens)"
$PY -m bench.gpu_engine_check 2>&1 | tee "$TABLE_DIR/engine_check.txt" | grep "engine check"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== kernel benchmarks (medians; bandwidth vs device copy)"
$PY -m bench.gpu_kernels --out "$TABLE_DIR" || status=1

# ---- end-to-end engine decode tokens/s: owned by the engine; runs when bench/gpu_e2e.py exists ----
if [ -f bench/gpu_e2e.py ]; then
    echo "== end-to-end (bench/gpu_e2e.py)"
    $PY -m bench.gpu_e2e || status=1
    $PY -m bench.gpu_e2e --kv-cache-dtype fp8_e4m3 || status=1
fi

echo "== summary (full numbers: ${OUT_DIR:-not kept, set OUT})"
grep "engine check" "$TABLE_DIR/engine_check.txt"
[ -f "$TABLE_DIR/gpu_kernels_table.txt" ] && cat "$TABLE_DIR/gpu_kernels_table.txt"
exit $status
