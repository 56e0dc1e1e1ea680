"""The GPU check (bench/gpu/check.sh) and its stages: python -m bench.gpu.NAME."""
