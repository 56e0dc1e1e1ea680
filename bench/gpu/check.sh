#!/usr/bin/env bash
# The GPU check: one command that measures and checks the engine on a CUDA host, stage by stage, most
# valuable per second first, each stage under its own `timeout` and all of them within PLAN_S seconds.
# Needs torch (CUDA), triton and transformers; installs nothing (docs/gpu.md: checking a GPU host).
#
#   bench/gpu/check.sh            the plan: the stages of plan() below
#   bench/gpu/check.sh more       the stages of more(), after the plan on the same host (within MORE_S):
#                                 they reuse .triton-cache/ and the checkpoint the plan wrote
#   bench/gpu/check.sh --dry-run  CPU: every stage of both at tiny shapes (the kernels and the engine's
#                                 Triton path under TRITON_INTERPRET=1, CUDA graphs emulated, the engine
#                                 end to end on the torch path), each under DRY_S
#
# Environment (all optional):
#   OUT     where the answers go: gpu_check.tar.gz (every stage's log and JSON), and beside it
#           summary.txt (the table), stages.tsv (name, exit code, seconds taken, timeout) and
#           device_params.json (the rehearsal's --device). Four files, re-packed after each stage, so
#           a run cut short keeps what ran. Default: $TMPDIR/pacore-gpu-check/out.
#   PLAN_S  the plan's budget in seconds (default 555): every stage's limit below is scaled by PLAN_S / 555
#           (PLAN_S=1110 gives each twice its time, for a slower host), and no stage starts or runs past
#           it; the summary and the packing run after it (<= SUMMARY_S + KILL_S + a few seconds).
#   MORE_S  more's budget (default 215), scaling more's limits likewise.   PYTHON: the interpreter (python3).
#   PACORE_GPU_CHECKPOINT  where the 16 GB random Qwen3-8B checkpoint is written once and reused
#           (default $TMPDIR/pacore-gpu-check/qwen3-8b-random): a new or empty folder, or one the check
#           wrote; any other (a downloaded model) is refused by the preflight, never written into.
# Exit: the summary's verdict: 0 every check PASS, 1 a FAIL row, 2 the check did not run (docs/gpu.md).
#   GPU_CHECK_WORK  the working folder the stages write into (default $TMPDIR/pacore-gpu-check/work).
#
# The machine this plan is sized for, borrowed for this project's runs (a user's host has none of these
# limits): one H200, torch 2.11 / triton 3.6 / transformers 5.17, python3 only (no `python`), no network;
# 15 minutes of device time in all, its start of 1-2 minutes included; one command at most 10 minutes;
# at most 8 files come back from $OUT (hence the one archive). Run the plan as one device command,
# `OUT=$OUT bench/gpu/check.sh`, with timeout_s 590 (PLAN_S 555 + the last stage's KILL_S + SUMMARY_S +
# packing); then `more` only if 4 minutes of device time are left. Kernel tests need pytest:
# where the machine lacks it, bench/gpu/vendor_pytest.sh puts it in .gpu-vendor/ to carry along.
set -uo pipefail
for v in OUT GPU_CHECK_WORK PACORE_GPU_CHECKPOINT; do  # relative to where it was started, not to the repo
    [ -n "${!v:-}" ] && [[ ${!v} != /* ]] && printf -v "$v" '%s' "$PWD/${!v}"
done
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu-vendor ] && export PYTHONPATH="$PYTHONPATH:$PWD/.gpu-vendor"
# Compiled kernels go to an ignored folder of the repo, so `more` on the same host reuses them.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.triton-cache}
PLAN_S=${PLAN_S:-555}  # the plan's stages start and end within this
MORE_S=${MORE_S:-215}  # more's
PLAN_REF=555 MORE_REF=215  # the budgets the stage limits below are written for: they scale by PLAN_S / PLAN_REF
# A stage that ignores `timeout`'s TERM is killed this much later. Python has no TERM handler here, so the
# signal ends it at once; the grace covers a process still tearing down its CUDA context.
KILL_S=2
SUMMARY_S=15           # the summary's timeout: it runs after the budget, whatever is left of it
DRY_S=900              # each stage's timeout in the dry run (the CPU interpreter is slow)
for v in PLAN_S MORE_S; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "$v must be a number of seconds, got '${!v}'" >&2; exit 2; }
done

BASE=${TMPDIR:-/tmp}/pacore-gpu-check
WORK=${GPU_CHECK_WORK:-$BASE/work}
OUT_DIR=$WORK/results  # every stage writes here; packed into $RETURN_DIR after each stage
RETURN_DIR=${OUT:-$BASE/out}
CKPT=${PACORE_GPU_CHECKPOINT:-$BASE/qwen3-8b-random}  # written once (stage checkpoint), then reused
DRY= TINY= CPU= PREFLIGHT=
KERNEL_TESTS= TEST_DEVICE=cuda  # every kernel test file (bench/gpu/kernel_tests.py), on the GPU
status=0 summary_rc=9
budget=$PLAN_S scale=$PLAN_S scale_ref=$PLAN_REF

pack() {  # the answers in four files: one archive of everything, the three first read beside it
    mkdir -p "$RETURN_DIR"
    tar -czf "$RETURN_DIR/gpu_check.tar.gz.part" -C "$OUT_DIR" . \
        && mv -f "$RETURN_DIR/gpu_check.tar.gz.part" "$RETURN_DIR/gpu_check.tar.gz"
    local f
    for f in summary.txt stages.tsv device_params.json; do
        [ -f "$OUT_DIR/$f" ] && cp -f "$OUT_DIR/$f" "$RETURN_DIR/$f"
    done
}

stage() {  # stage [-f] NAME SECONDS COMMAND...: COMMAND under `timeout`, logged to $OUT_DIR/NAME.log
    local force= name secs t0=$SECONDS rc
    [ "$1" = -f ] && { force=1; shift; }  # -f: run even with the budget spent
    name=$1 secs=$2
    shift 2
    if [ -n "$DRY" ]; then
        secs=$DRY_S
    elif [ -z "$force" ]; then
        secs=$(( secs * scale / scale_ref ))
        local left=$(( budget - SECONDS ))
        [ "$secs" -gt "$left" ] && secs=$left
    fi
    if [ "$secs" -lt 10 ]; then
        echo "== $name: skipped, the budget is spent"
        printf '%s\tskipped\t0\t0\n' "$name" >> "$OUT_DIR/stages.tsv"
        status=1  # a stage that did not run answered nothing
        pack
        return 0
    fi
    echo "== $name (timeout ${secs}s)"
    timeout --kill-after=$KILL_S "$secs" "$@" > "$OUT_DIR/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( SECONDS - t0 ))" "$secs" >> "$OUT_DIR/stages.tsv"
    { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && echo "   timed out: what it wrote is kept"
    tail -n 3 "$OUT_DIR/$name.log" | cut -c1-400 | sed 's/^/   /'
    [ "$rc" -eq 0 ] || status=1
    pack
    return "$rc"
}

have_pytest() {
    $PY -c "import pytest" 2>/dev/null && return 0
    echo "== kernel_tests: skipped, pytest does not import (bench/gpu/vendor_pytest.sh puts it in .gpu-vendor/)"
    return 1
}

finish() {  # the table, packed; printed last. The summary's exit code is the check's (docs/gpu.md: 0, 1, 2)
    stage -f summary $SUMMARY_S $PY -m bench.gpu.summary "$OUT_DIR"
    summary_rc=$?
    [ -f "$OUT_DIR/summary.txt" ] && { echo "== the table ($RETURN_DIR/summary.txt)"; cat "$OUT_DIR/summary.txt"; }
    echo "== every log and JSON: $RETURN_DIR/gpu_check.tar.gz (unpacked: $OUT_DIR)"
}

plan() {  # the plan, by value per second.  NAME  TIMEOUT(s) at PLAN_S=555  COMMAND
    # Three limits are estimates, not measurements (docs/gpu.md, the plan's limits), each ~1.5x its estimate:
    # fp8_weights ~45 s: imports ~8, ~3 Triton block-kernel compiles ~10, 40 timed GEMMs and 16 graph
    #   captures ~7, the tiny FP8-weight engine (two loads and their graphs; its kernels compile here once) ~20;
    # checkpoint ~30 s: 16.4 GB written at 1 GB/s ~16, drawing and imports ~12 (a 0.5 GB/s disk still fits);
    # e2e_rounds ~95 s: 4 engine loads (16.4 GB from the page cache, graph capture) ~12 each, the engine's
    #   kernels the earlier stages did not compile ~20, decoding ~15, imports ~10.
    local e2e=($PY -m bench.gpu.e2e --checkpoint "$CKPT" --out "$OUT_DIR" $TINY)
    stage preflight        45  $PY -m bench.gpu.preflight $PREFLIGHT --checkpoint "$CKPT" "$(dirname "$CKPT")" || { finish; exit 2; }
    stage kernels_decode   85  $PY -m bench.gpu.kernels --only copy,paged,cascade --out "$OUT_DIR" $TINY
    stage spec_kernels     55  $PY -m bench.gpu.spec_kernels --out "$OUT_DIR" $TINY
    stage prefill          50  $PY -m bench.gpu.kernels --only prefill --out "$OUT_DIR" $TINY
    stage fp8_weights      60  $PY -m bench.gpu.fp8_gemm --engine --out "$OUT_DIR" $TINY
    stage checkpoint       50  "${e2e[@]}" --only checkpoint
    stage e2e_rounds      130  "${e2e[@]}" --only throughput,spec --cases round1,round2
    stage e2e_logits       55  "${e2e[@]}" --only logits
}

more() {  # after the plan, on the same host.  NAME  TIMEOUT(s)  COMMAND
    local e2e=($PY -m bench.gpu.e2e --checkpoint "$CKPT" --out "$OUT_DIR" $TINY)
    # the kernel tests in parallel processes (compiles are CPU work), without -x: a failure hides nothing
    have_pytest && stage kernel_tests 75  $PY -m bench.gpu.kernel_tests --out "$OUT_DIR" --device $TEST_DEVICE $KERNEL_TESTS
    stage engine_check      35  $PY -m bench.gpu.engine_check $CPU
    stage kernels_rest      20  $PY -m bench.gpu.kernels --only offsets,replay --out "$OUT_DIR" $TINY
    stage e2e_more          50  "${e2e[@]}" --only hf,fp8
}

case "${1:-}" in
"")
    rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR" "$(dirname "$CKPT")"  # a new check: no answer of an earlier one is kept
    (cd "$RETURN_DIR" 2>/dev/null && rm -f gpu_check.tar.gz summary.txt stages.tsv device_params.json)
    plan ;;
more)
    budget=$MORE_S scale=$MORE_S scale_ref=$MORE_REF
    mkdir -p "$OUT_DIR"  # beside the plan's answers
    more ;;
--dry-run)
    [ -n "${GPU_CHECK_WORK:-}" ] || WORK=$(mktemp -d)
    OUT_DIR=$WORK/results RETURN_DIR=${OUT:-$WORK/out} CKPT=$WORK/checkpoint
    rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
    DRY=1 TINY=--tiny CPU="--cpu --tiny" PREFLIGHT=--dry-run
    KERNEL_TESTS=tests/pacore_kernels/test_kernels_cascade_plan.py TEST_DEVICE=cpu  # CI runs them all on CPU
    plan
    more ;;
*) echo "usage: bench/gpu/check.sh [more|--dry-run]" >&2; exit 2 ;;
esac
finish
[ -n "$DRY" ] && [ "$status" -eq 0 ] && echo "dry run OK"
[ "$summary_rc" -le 2 ] && exit "$summary_rc"  # 0 every check PASS, 1 a FAIL row, 2 the check did not run
exit $status  # the summary itself failed
