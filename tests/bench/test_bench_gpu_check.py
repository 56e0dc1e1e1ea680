"""bench/gpu_check.sh on a host like the GPU machine: `python3` only (no `python`), maybe no pytest."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, with_pytest: bool, *args: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("#!/bin/sh\necho 'python: command not found' >&2\nexit 127\n")
    shadow = tmp_path / "shadow"  # a `pytest` module that fails to import, first on the path
    shadow.mkdir()
    (shadow / "pytest.py").write_text("raise ImportError('no pytest here')\n")
    path = str(ROOT) if with_pytest else f"{shadow}{os.pathsep}{ROOT}"  # the shadow before site-packages
    (bin_dir / "python3").write_text(f"#!/bin/sh\nPYTHONPATH={path} exec {sys.executable} \"$@\"\n")
    for f in ("python", "python3"):
        (bin_dir / f).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "OUT", "TRITON_CACHE_DIR")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", str(ROOT / "bench/gpu_check.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_dry_run_uses_python3(tmp_path):
    # both GPU scripts' --tiny paths (kernels under the interpreter, the engine end to end on CPU)
    proc = _run(tmp_path, True, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run OK" in proc.stdout and "pytest does not import" not in proc.stdout
    assert "prefill" in proc.stdout and "graph replay" in proc.stdout  # the kernels table
    for fmt in ("auto", "fp8_e4m3"):  # decode cases in both KV formats by default
        assert f"paged   {fmt} " in proc.stdout and f"cascade {fmt} " in proc.stdout


def test_missing_pytest_is_reported_and_a_command_is_required(tmp_path):
    proc = _run(tmp_path, False)
    assert "pytest does not import" in proc.stdout
    assert proc.returncode == 2 and "usage: bench/gpu_check.sh kernels|engine|--dry-run" in proc.stderr
