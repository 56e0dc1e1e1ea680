#!/usr/bin/env bash
# The GPU run (issue 27): ONE prepared command that fits one lease (15 minutes of device time, a
# machine start included; each command at most 10 minutes). On an H200 with torch, triton and
# transformers (python3 only; this script installs nothing):
#
#   bench/gpu_check.sh            the plan: the stages of plan() below, most valuable first, each under
#                                 its own `timeout`; the timeouts (+ KILL_S each) sum under 9 minutes
#                                 (tests/bench/test_bench_gpu_check.py checks it), and a stage never runs
#                                 past PLAN_S. Run it as one device command with timeout_s >= 560.
#   bench/gpu_check.sh more       only if the lease still has >= 4 minutes after the plan, on the same
#                                 warm machine: the stages of more() (<= MORE_S), which reuse
#                                 .triton-cache/ and the checkpoint the plan wrote.
#   bench/gpu_check.sh --dry-run  CPU: every stage of both at tiny shapes (the kernels and the engine's
#                                 Triton path under TRITON_INTERPRET=1, CUDA graphs emulated, the engine
#                                 end to end on the torch path), each under DRY_S.
#
# $OUT (the device tool sets it; optional): receives gpu_kernels.json, gpu_e2e.json, device_params.json
# (the rehearsal's --device), stages.tsv (name, exit code, seconds taken, timeout), a log per stage and
# summary.txt. Every stage writes its JSON after each case, so a timeout keeps what ran. The table
# prints last. Kernel tests need pytest: if the machine lacks it, bench/vendor_pytest.sh puts it in
# .gpu-vendor/ here, to carry along (run(..., carry=[".gpu-vendor"])).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}  # the GPU machine has python3 only
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu-vendor ] && export PYTHONPATH="$PYTHONPATH:$PWD/.gpu-vendor"
# Compiled kernels go to an ignored folder of the repo, so `more` on the same machine reuses them.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.triton-cache}
PLAN_S=530  # the plan's stages start and end within this (9 minutes less a margin for the tool)
MORE_S=215  # more's
KILL_S=5    # a stage that ignores `timeout`'s TERM is killed this much later
DRY_S=900   # each stage's timeout in the dry run (the CPU interpreter is slow)

DIR=${OUT:-$(mktemp -d)}
mkdir -p "$DIR"
DRY= TINY= CPU= PREFLIGHT=--preflight
KERNEL_TESTS= TEST_DEVICE=cuda  # every kernel test file (bench/gpu_kernel_tests.py), on the GPU
CKPT=${PACORE_GPU_CHECKPOINT:-${TMPDIR:-/tmp}/pacore-gpu-check/qwen3-8b-random}  # written once, reused
status=0
budget=$PLAN_S

stage() {  # stage NAME SECONDS COMMAND...: run COMMAND under `timeout`, log to $DIR/NAME.log
    local name=$1 secs=$2 t0=$SECONDS rc
    shift 2
    if [ -n "$DRY" ]; then
        secs=$DRY_S
    else
        local left=$(( budget - SECONDS ))
        [ "$secs" -gt "$left" ] && secs=$left
    fi
    if [ "$secs" -lt 10 ]; then
        echo "== $name: skipped, the budget is spent"
        printf '%s\tskipped\t0\t0\n' "$name" >> "$DIR/stages.tsv"
        return 0
    fi
    echo "== $name (timeout ${secs}s)"
    timeout --kill-after=$KILL_S "$secs" "$@" > "$DIR/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( SECONDS - t0 ))" "$secs" >> "$DIR/stages.tsv"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "   timed out: what it wrote is kept"
    tail -n 3 "$DIR/$name.log" | cut -c1-400 | sed 's/^/   /'
    [ "$rc" -eq 0 ] || status=1
    return "$rc"
}

have_pytest() {
    $PY -c "import pytest" 2>/dev/null && return 0
    echo "== kernel_tests: skipped, pytest does not import (bench/vendor_pytest.sh, then carry .gpu-vendor)"
    return 1
}

plan() {  # the plan: most valuable first.  NAME  TIMEOUT(s)  COMMAND
    stage preflight         20  $PY -m bench.gpu_summary $PREFLIGHT || exit 2
    stage kernels_decode   100  $PY -m bench.gpu_kernels --only copy,paged,cascade --out "$DIR" $TINY
    stage e2e_logits       130  $PY -m bench.gpu_e2e --only load,logits --checkpoint "$CKPT" --out "$DIR" $TINY
    stage e2e_rounds       110  $PY -m bench.gpu_e2e --only throughput --cases round1,round2 --checkpoint "$CKPT" \
                                    --out "$DIR" $TINY
    stage prefill           60  $PY -m bench.gpu_kernels --only prefill --out "$DIR" $TINY
    # Slot for the speculative-decoding kernels (another helper's bench/gpu_spec_kernels.py): it runs once
    # that module exists, and takes --out DIR (and --tiny in the dry run), writing its JSON after each case.
    [ -f bench/gpu_spec_kernels.py ] && stage spec_kernels 60 $PY -m bench.gpu_spec_kernels --out "$DIR" $TINY
    stage summary           10  $PY -m bench.gpu_summary "$DIR"
}

more() {  # only with time left after the plan, on the same machine.  NAME  TIMEOUT(s)  COMMAND
    # the kernel tests in parallel processes (compiles are CPU work), without -x: a failure hides nothing
    have_pytest && stage kernel_tests 75  $PY -m bench.gpu_kernel_tests --out "$DIR" --device $TEST_DEVICE $KERNEL_TESTS
    stage engine_check      35  $PY -m bench.gpu_engine_check $CPU
    stage kernels_rest      20  $PY -m bench.gpu_kernels --only offsets,replay --out "$DIR" $TINY
    stage e2e_more          50  $PY -m bench.gpu_e2e --only hf,fp8 --checkpoint "$CKPT" --out "$DIR" $TINY
    stage summary           10  $PY -m bench.gpu_summary "$DIR"
}

case "${1:-}" in
"") plan ;;
more) budget=$MORE_S; more ;;
--dry-run)
    DRY=1 TINY=--tiny CPU="--cpu --tiny" CKPT=$DIR/checkpoint PREFLIGHT=--dry-run
    KERNEL_TESTS=tests/kernels/test_kernels_cascade_plan.py TEST_DEVICE=cpu  # CI runs them all on CPU
    plan
    more
    [ "$status" -eq 0 ] && echo "dry run OK" ;;
*) echo "usage: bench/gpu_check.sh [more|--dry-run]" >&2; exit 2 ;;
esac
[ -f "$DIR/summary.txt" ] && { echo "== the table ($DIR/summary.txt)"; cat "$DIR/summary.txt"; }
echo "== full numbers: ${OUT:-$DIR (not kept: set OUT)}"
exit $status
