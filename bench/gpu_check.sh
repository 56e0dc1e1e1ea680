#!/usr/bin/env bash
# The GPU run of issue 18, in two commands of <= ~9 minutes each on an H200 (torch and triton installed;
# this script installs nothing):
#
#   bench/gpu_check.sh kernels    command 1: the kernel tests on the GPU (when pytest imports), then
#                                 bench/gpu_kernels.py (kernels at PaCoRe-8B's shape vs fp32 and copy bandwidth;
#                                 paged and cascade decode with bf16 and FP8 e4m3 KV caches)
#   bench/gpu_check.sh engine     command 2: the engine's tokens through Triton + CUDA graphs vs the torch
#                                 path (tiny model), then bench/gpu_e2e.py (Qwen3-8B-shaped, YaRN to 131k;
#                                 its last section: round 1/2 decode tokens/s with an FP8 e4m3 KV cache)
#   bench/gpu_check.sh --dry-run  CPU only: both scripts' --tiny paths under the Triton interpreter
#
# $OUT (optional): folder that receives the json (gpu_kernels.json, gpu_e2e.json, device_params.json) and
# logs; every script writes its json after each case, so a timeout keeps what ran. The table prints last.
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

case "${1:-}" in
--dry-run)
    TRITON_INTERPRET=1 $PY -m bench.gpu_kernels --tiny --out "$TABLE_DIR" >/dev/null || exit 1
    $PY -m bench.gpu_e2e --tiny --out "$TABLE_DIR" >/dev/null 2>&1 || exit 1
    echo "dry run OK"
    cat "$TABLE_DIR/gpu_kernels_table.txt"
    exit 0;;
kernels|engine) ;;
*)
    echo "usage: bench/gpu_check.sh kernels|engine|--dry-run" >&2
    exit 2;;
esac

$PY - <<'PY' || exit 2
import torch, triton
assert torch.cuda.is_available(), "no CUDA device"
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
PY

if [ "$1" = kernels ]; then
    if [ "$HAVE_PYTEST" = 1 ]; then
        echo "== kernel tests on the GPU (fp32 + bf16 + fp16)"
        PACORE_TEST_DEVICE=cuda PACORE_TEST_DTYPES=bfloat16,float16 timeout 240 \
            $PY -m pytest tests/kernels/test_kernels_*.py -q -x -p no:cacheprovider --noconftest 2>&1 \
            | tee ${OUT_DIR:+"$OUT_DIR/gpu_tests.log"} | tail -n 30
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    fi
    echo "== kernels at PaCoRe-8B's shape (bench/gpu_kernels.py)"
    timeout 270 $PY -m bench.gpu_kernels --out "$TABLE_DIR" || status=1
    [ -f "$TABLE_DIR/gpu_kernels_table.txt" ] && cat "$TABLE_DIR/gpu_kernels_table.txt"
else
    echo "== engine on the GPU: triton + CUDA graphs vs torch references (greedy tokens, tiny model)"
    timeout 100 $PY -m bench.gpu_engine_check 2>&1 | tee "$TABLE_DIR/engine_check.txt" | grep "engine check"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    echo "== engine end to end, Qwen3-8B-shaped (bench/gpu_e2e.py)"
    timeout 420 $PY -m bench.gpu_e2e --out "$TABLE_DIR" 2>&1 | tee "$TABLE_DIR/gpu_e2e.log" | grep "^== " | cut -c1-400
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo "== full numbers: ${OUT_DIR:-not kept, set OUT}"
exit $status
