#!/usr/bin/env bash
# Put pytest (pure Python, with its dependencies) into .gpu-vendor/ (ignored by git), for a GPU machine
# that has no pytest and no network: bench/gpu/check.sh adds .gpu-vendor to PYTHONPATH when it exists,
# and a device run carries it along (run(..., carry=[".gpu-vendor"])). Needs pip and PyPI here.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
rm -rf .gpu-vendor
# Pure-Python wheels only (py3-none-any), so they import on the GPU machine's Python whatever it is;
# exceptiongroup and tomli are pytest's dependencies below Python 3.11 (pip evaluates markers for this one).
$PY -m pip install --quiet --no-compile --target .gpu-vendor --python-version 3.10 --implementation py \
    --only-binary=:all: pytest exceptiongroup tomli
du -sh .gpu-vendor
