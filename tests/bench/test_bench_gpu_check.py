"""bench/gpu/check.sh, the GPU check: its dry run on a host like the GPU machine (`python3` only, maybe no
pytest), what comes back (four files in $OUT), and its stage timeouts read from the script."""
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/gpu/check.sh"


def _run(tmp_path, with_pytest: bool, *args: str, out: Path | None = None, **env_vars: str):
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
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON", "OUT", "TRITON_CACHE_DIR", "PYTHONPATH", "PLAN_S", "GPU_CHECK_WORK")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", TMPDIR=str(tmp_path), **env_vars)  # its own work folders
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)


def _stages(function: str) -> dict[str, int]:
    """NAME -> timeout of the `stage NAME SECONDS ...` lines in the body of a function of the script."""
    body = re.search(rf"^{function}\(\) \{{[^\n]*\n(.*?)^\}}", SCRIPT.read_text(), re.S | re.M).group(1)
    code = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))
    return {m[0]: int(m[1]) for m in re.findall(r"\bstage\s+(\w+)\s+(\d+)\b", code)}


def _setting(name: str) -> int:
    """A setting's value, or its default where the environment may set it (NAME=${NAME:-default})."""
    return int(re.search(rf"^{name}=(?:\$\{{{name}:-)?(\d+)", SCRIPT.read_text(), re.M).group(1))


def test_the_plan_fits_one_command():
    """The default plan's timeouts (with kill grace) fit PLAN_S; the plan, the summary and the packing fit one
    command of 10 minutes; `more` fits what a lease has left."""
    kill = _setting("KILL_S")
    plan, more = _stages("plan"), _stages("more")
    assert list(plan) == ["preflight", "kernels_decode", "spec_kernels", "prefill", "fp8_weights", "checkpoint",
                          "e2e_rounds", "e2e_logits"]  # by value per second; the logits check last
    # A cold host (nothing in the page cache, CUDA not yet initialised) spends ~30 s importing torch,
    # transformers and triton and creating the first CUDA context: the preflight must not be cut there.
    assert plan["preflight"] >= 45
    worst = sum(plan.values()) + kill * len(plan)
    assert worst <= _setting("PLAN_S"), plan
    assert _setting("PLAN_S") + kill + _setting("SUMMARY_S") + 15 <= 600 - 10  # 15: packing
    assert sum(more.values()) + kill * len(more) <= _setting("MORE_S") <= 4 * 60 - 25, more
    assert {"kernel_tests", "engine_check", "kernels_rest"} <= set(more)
    # docs/gpu.md's stage tables give the script's timeouts
    documented = dict(re.findall(r"^ *\| `(\w+)` \| (\d+) s \|", (ROOT / "docs/gpu.md").read_text(), re.M))
    assert {k: int(v) for k, v in documented.items()} == {**plan, **more, "summary": _setting("SUMMARY_S")}


def test_the_budget_comes_from_the_environment(tmp_path):
    """PLAN_S=5: every stage is skipped, said so in stages.tsv, the summary still runs and the answers still
    come back (exit 2: the check did not run); a PLAN_S that is not a number is refused."""
    out = tmp_path / "out"
    proc = _run(tmp_path, True, out=out, PLAN_S="5")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()]
    # the summary's exit code is its verdict: 2, its preflight did not run; a FAIL row for every stage
    assert [r[:2] for r in rows] == [[name, "skipped"] for name in _stages("plan")] + [["summary", "2"]]
    summary = (out / "summary.txt").read_text()
    assert all(f"stage {name} FAIL: skipped" in summary for name in _stages("plan"))
    assert f"verdicts: 0 PASS, {len(_stages('plan'))} FAIL" in summary
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "stages.tsv", "summary.txt"]
    (tmp_path / "again").mkdir()
    bad = _run(tmp_path / "again", True, out=out, PLAN_S="9m")
    assert bad.returncode == 2 and "PLAN_S must be a number of seconds, got '9m'" in bad.stderr


def test_dry_run_runs_every_stage_at_tiny_shapes(tmp_path):
    out = tmp_path / "out"
    proc = _run(tmp_path, True, "--dry-run", out=out)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "dry run OK" in proc.stdout and "pytest does not import" not in proc.stdout
    # what comes back: at most 8 files (the device tool's limit), every log and JSON inside the archive
    returned = sorted(p.name for p in out.iterdir())
    assert returned == ["device_params.json", "gpu_check.tar.gz", "stages.tsv", "summary.txt"] and len(returned) <= 8
    extracted = tmp_path / "extracted"
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        tar.extractall(extracted, filter="data")
    stages = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()]
    assert [name for name, *_ in stages] == list(_stages("plan")) + list(_stages("more")) + ["summary"]
    assert all(rc == "0" for _, rc, *_ in stages), stages
    assert {f"{name}.log" for name, *_ in stages} | {"gpu_kernels.json", "gpu_spec_kernels.json", "gpu_e2e.json",
                                                      "device_params.json", "summary.txt"} <= set(os.listdir(extracted))
    out = extracted  # the archive holds what the stages wrote
    table = (out / "summary.txt").read_text()  # the table printed last
    assert "graph replay" in table and "cascade auto     round2" in table and "prefill     96" in table
    for fmt in ("auto", "fp8_e4m3"):  # decode cases in both KV formats by default
        assert f"paged   {fmt} " in table and f"cascade {fmt} " in table
    # speculative decoding in the summary: verify at 1/3/5 queries, the draft window, cascade with 5, the sampler
    assert all(f"q_len={q}" in table for q in (1, 3, 5)) and "sink 4 + window 16" in table
    assert "cascade auto     K=2 P=32 S=16 q_len=5" in table and "4/4 tokens as the torch reference  PASS" in table
    assert "spec self_window" in table and "spec ngram" in table
    assert "logits vs transformers (cascade, graphs False): PASS" in table
    verdicts = re.search(r"verdicts: (\d+) PASS, (\d+) FAIL", table)
    assert int(verdicts[1]) >= 30 and verdicts[2] == "0" and "FAIL" not in table.replace("0 FAIL", "")
    # the stages wrote into one folder: every kernel case, every engine section
    cases = {r["case"] for r in json.loads((out / "gpu_kernels.json").read_text())["rows"]}
    assert cases == {"copy", "paged", "cascade", "prefill", "offsets", "replay"}
    report = json.loads((out / "gpu_e2e.json").read_text())
    assert {"checkpoint", "load", "logits", "throughput", "spec", "hf", "fp8", "memory"} <= set(report)
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


def test_a_shadowed_import_stops_the_check_at_preflight_in_one_line(tmp_path):
    shim = tmp_path / "shim" / "transformers"  # shadows the installed transformers for every stage
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("")
    proc = _run(tmp_path, True, "--dry-run", out=tmp_path / "out", PYTHONPATH=str(shim.parent))
    assert proc.returncode == 2, proc.stdout[-3000:]
    rows = (tmp_path / "out" / "stages.tsv").read_text().splitlines()
    assert [r.split("\t")[:2] for r in rows] == [["preflight", "2"], ["summary", "2"]]  # no stage after it ran
    assert "   preflight: `from transformers import AutoModelForCausalLM` fails (AttributeError" in proc.stdout


def test_without_a_gpu_the_plan_stops_at_preflight(tmp_path):
    proc = _run(tmp_path, False, out=tmp_path / "out")
    assert proc.returncode == 2 and "no CUDA device" in proc.stdout
    assert "pytest missing" in proc.stdout  # the host check names what the kernel tests need
    rows = (tmp_path / "out" / "stages.tsv").read_text().splitlines()  # what it found still comes back
    assert [r.split("\t")[0] for r in rows] == ["preflight", "summary"]
    assert rows[0].split("\t")[3] == str(_stages("plan")["preflight"])
    (tmp_path / "twice").mkdir()  # PLAN_S scales every stage's limit: twice the budget, twice the time
    _run(tmp_path / "twice", False, out=tmp_path / "twice" / "out", PLAN_S=str(2 * _setting("PLAN_S")))
    rows = (tmp_path / "twice" / "out" / "stages.tsv").read_text().splitlines()
    assert rows[0].split("\t")[3] == str(2 * _stages("plan")["preflight"])
    proc = subprocess.run(["bash", str(SCRIPT), "kernels"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: bench/gpu/check.sh [more|--dry-run]" in proc.stderr
