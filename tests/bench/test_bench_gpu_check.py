"""bench/gpu_check.sh, the GPU plan: its dry run on a host like the GPU machine (`python3` only, maybe no
pytest), and its stage timeouts read from the script: they must fit one lease."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/gpu_check.sh"


def _run(tmp_path, with_pytest: bool, *args: str, out: Path | None = None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("#!/bin/sh\necho 'python: command not found' >&2\nexit 127\n")
    shadow = tmp_path / "shadow"  # a `pytest` module that fails to import, first on the path
    shadow.mkdir()
    (shadow / "pytest.py").write_text("raise ImportError('no pytest here')\n")
    path = str(ROOT) if with_pytest else f"{shadow}{os.pathsep}{ROOT}"  # the shadow before site-packages
    shim = f"#!/bin/sh\nPYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} \"$@\"\n"
    (bin_dir / "python3").write_text(shim)
    for f in ("python", "python3"):
        (bin_dir / f).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "OUT", "TRITON_CACHE_DIR", "PYTHONPATH")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)


def _stages(function: str) -> dict[str, int]:
    """NAME -> timeout of the `stage NAME SECONDS ...` lines in the body of a function of the script."""
    body = re.search(rf"^{function}\(\) \{{[^\n]*\n(.*?)^\}}", SCRIPT.read_text(), re.S | re.M).group(1)
    return {m[0]: int(m[1]) for m in re.findall(r"\bstage\s+(\w+)\s+(\d+)\b", body)}


def _setting(name: str) -> int:
    return int(re.search(rf"^{name}=(\d+)", SCRIPT.read_text(), re.M).group(1))


def test_the_plan_fits_one_lease():
    """One command of <= 9 minutes, a timeout in it for every stage; `more` in what a lease has left."""
    kill = _setting("KILL_S")
    plan, more = _stages("plan"), _stages("more")
    assert list(plan)[:5] == ["preflight", "kernels_decode", "e2e_logits", "e2e_rounds", "prefill"]  # by value
    assert plan["spec_kernels"] == 60  # the slot for the speculative-decoding kernels
    worst = sum(plan.values()) + kill * len(plan)
    assert worst <= _setting("PLAN_S") <= 9 * 60 - 10, plan
    assert sum(more.values()) + kill * len(more) <= _setting("MORE_S") <= 4 * 60 - 25, more
    assert {"kernel_tests", "engine_check", "kernels_rest"} <= set(more)


def test_dry_run_runs_every_stage_at_tiny_shapes(tmp_path):
    out = tmp_path / "out"
    proc = _run(tmp_path, True, "--dry-run", out=out)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "dry run OK" in proc.stdout and "pytest does not import" not in proc.stdout
    stages = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()]
    spec = {"spec_kernels"} if (ROOT / "bench/gpu_spec_kernels.py").exists() else set()  # its slot runs once it exists
    assert {name for name, *_ in stages} == (set(_stages("plan")) | set(_stages("more"))) - {"spec_kernels"} | spec
    assert all(rc == "0" for _, rc, *_ in stages), stages
    table = (out / "summary.txt").read_text()  # the table printed last
    assert "graph replay" in table and "cascade auto     round2" in table and "prefill     96" in table
    for fmt in ("auto", "fp8_e4m3"):  # decode cases in both KV formats by default
        assert f"paged   {fmt} " in table and f"cascade {fmt} " in table
    # the stages wrote into one folder: every kernel case, every engine section
    cases = {r["case"] for r in json.loads((out / "gpu_kernels.json").read_text())["rows"]}
    assert cases == {"copy", "paged", "cascade", "prefill", "offsets", "replay"}
    report = json.loads((out / "gpu_e2e.json").read_text())
    assert {"load", "logits", "throughput", "hf", "fp8", "memory"} <= set(report)
    assert not [k for k in report if k.endswith("_error")]
    assert {r["case"] for r in report["throughput"]} == {"round1", "round2"}
    # the engine's Triton path under the interpreter, with the decode graphs emulated (speculative verify
    # and draft steps too), against torch
    check = (out / "engine_check.log").read_text()
    assert check.count("PASS") == 5 and "FAIL" not in check and "fp32 triton + graphs == torch, cascade True" in check
    assert "fp32 triton + graphs + ngram == torch" in check and "fp32 triton + graphs + self_window == torch" in check
    from engine.device_model import DeviceParams
    params = DeviceParams.from_file(out / "device_params.json")  # the rehearsal's --device reads it
    assert params.source == str(out / "device_params.json")
    raw = json.loads((out / "device_params.json").read_text())
    assert {"paged_decode_bw_frac_min_16k", "cascade_speedup_vs_paged", "prefill_tflops", "engine"} <= set(raw)


def test_without_a_gpu_the_plan_stops_at_preflight(tmp_path):
    proc = _run(tmp_path, False)
    assert proc.returncode == 2 and "no CUDA device" in proc.stdout
    assert "pytest missing" in proc.stdout  # the host check names what the kernel tests need
    proc = subprocess.run(["bash", str(SCRIPT), "kernels"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: bench/gpu_check.sh [more|--dry-run]" in proc.stderr
