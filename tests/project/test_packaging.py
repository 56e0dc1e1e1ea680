"""The package installs nothing under a name another distribution owns, and its wheel works beside Hugging
Face's `kernels` (which transformers requires): the project's own `kernels/` once shadowed it from the
repository root and overwrote it when installed from a wheel (issue 43)."""
import importlib.metadata
import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tiny_models import hf_greedy

ROOT = Path(__file__).resolve().parents[2]
DIST = "pacore-engine"
TOP_LEVEL = {"engine", "pacore", "pacore_kernels"}  # bench/ runs from a checkout: PyPI's `bench` owns the name


def test_each_top_level_name_belongs_to_this_project_alone():
    owners = importlib.metadata.packages_distributions()
    ours = {name for name, dists in owners.items() if DIST in dists}
    assert ours == TOP_LEVEL
    assert {name: sorted(set(owners[name])) for name in ours} == {name: [DIST] for name in ours}


def test_pip_check_is_clean():
    """Every installed distribution's requirements are met (the embedded model's wheel is downloaded, not
    installed --no-deps, for this)."""
    done = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _source_copy(dest: Path) -> Path:
    """The tree a clean checkout has: setuptools' build/ folder in the repository could carry stale files."""
    skip = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "runs", "*.egg-info", "__pycache__", "site",
                                  ".pytest_cache", ".hypothesis", ".benchmarks", ".triton-cache", ".gpu-vendor")
    return Path(shutil.copytree(ROOT, dest, ignore=skip))


def _venv_beside_hf_kernels(venv: Path) -> Path:
    """A fresh venv with Hugging Face's `kernels` installed in it (copied with its RECORD from this test
    environment, so pip there knows it) and this environment's site-packages behind its own for torch,
    transformers and the rest. This environment's editable finder is not active there (a .pth listed in a
    .pth is not run)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    site = Path(subprocess.run([venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    hf = importlib.metadata.distribution("kernels")
    shutil.copytree(Path(hf.locate_file("kernels")), site / "kernels")
    shutil.copytree(Path(hf._path), site / Path(hf._path).name)  # its dist-info
    (site / "zz_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return site


@pytest.mark.slow
def test_the_wheel_installs_beside_hugging_faces_kernels_and_both_import(tmp_path, tiny_model_dir):
    """Build the real wheel, install it --no-deps into a venv that has Hugging Face's `kernels`, then from a
    folder outside the repository: transformers' model loading imports (its hub-kernels integration is
    what a shadowed `kernels` broke), and the installed engine generates a tiny model's greedy tokens."""
    pytest.importorskip("kernels")
    src = _source_copy(tmp_path / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--disable-pip-version-check", "-w", str(tmp_path / "wheel"), str(src)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "wheel").glob("pacore_engine-*.whl"))
    venv = tmp_path / "venv"
    site = _venv_beside_hf_kernels(venv)
    hf_init = (site / "kernels/__init__.py").read_bytes()
    before = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")}
    done = subprocess.run([venv / "bin/pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                           str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (site / "kernels/__init__.py").read_bytes() == hf_init  # the wheel wrote nothing into HF's package
    added = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")} - before
    assert added == TOP_LEVEL

    model = tiny_model_dir("qwen3")
    prompt = [5, 17, 3, 42, 9]
    expected, _ = hf_greedy(model, prompt, 8)
    script = textwrap.dedent(f"""
        import json, sys
        import kernels, transformers
        import transformers.integrations.hub_kernels
        from transformers import AutoModelForCausalLM
        import engine, pacore, pacore_kernels
        from engine import LLM, SamplingParams
        site = {str(site)!r}
        assert all(m.__file__.startswith(site) for m in (engine, pacore, pacore_kernels, kernels)), sys.path
        llm = LLM({str(model)!r}, dtype="float32")
        out = llm.generate([{prompt!r}], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
        print(json.dumps(out[0].outputs[0].token_ids))
    """)
    ran = subprocess.run([venv / "bin/python", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "HF_HUB_OFFLINE": "1"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == list(expected)
