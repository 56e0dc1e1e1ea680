"""bench/gpu/preflight.py: a broken or shadowed import, or a checkpoint folder the check did not create, is one
line and exit 2 before any stage runs."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _preflight(tmp_path, *args, pythonpath: str = ""):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "bench.gpu.preflight", "--dry-run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_shadowed_transformers_is_one_line(tmp_path):
    shim = tmp_path / "shim" / "transformers"  # a package that shadows the installed transformers
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("__version__ = '0.0'\n")
    proc = _preflight(tmp_path, pythonpath=str(shim.parent))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stdout.strip().splitlines()
    assert line.startswith("preflight: `from transformers import AutoModelForCausalLM` fails")
    assert str(shim / "__init__.py") in line and "shadows it" in line


def test_a_module_that_breaks_as_it_loads_is_one_line(tmp_path):
    shim = tmp_path / "shim" / "safetensors"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise RuntimeError('half-installed')\n")
    proc = _preflight(tmp_path, pythonpath=str(shim.parent))
    assert proc.returncode == 2
    assert proc.stdout.strip() == (f"preflight: `import safetensors` fails (RuntimeError: half-installed); safetensors "
                                   f"is {shim / '__init__.py'}: fix or remove that install, or the PYTHONPATH entry "
                                   f"that shadows it")


def test_a_downloaded_model_as_the_checkpoint_folder_is_refused(tmp_path):
    model = tmp_path / "PaCoRe-8B"
    model.mkdir()
    (model / "config.json").write_text("{}")
    proc = _preflight(tmp_path, "--checkpoint", str(model), str(tmp_path))
    assert proc.returncode == 2
    [line] = proc.stdout.strip().splitlines()
    assert line.startswith(f"preflight: PACORE_GPU_CHECKPOINT={model} holds files this check did not write")
    assert os.listdir(model) == ["config.json"]
    ok = _preflight(tmp_path, "--checkpoint", str(tmp_path / "new"), str(tmp_path))
    assert ok.returncode == 0 and "no CUDA device (dry run: CPU)" in ok.stdout, ok.stdout + ok.stderr
