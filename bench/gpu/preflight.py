"""The GPU check's first stage (bench/gpu/check.sh): can this host run the stages at all?

    python3 -m bench.gpu.preflight [--checkpoint DIR] [FOLDER ...]   # exit 2 without CUDA
    python3 -m bench.gpu.preflight --dry-run [--checkpoint DIR] [FOLDER ...]   # the same on a CPU host

In order, each failure one line and exit 2, before any stage spends its time:
1. the modules every stage imports, from the repository root first (the engine, its kernels, and
   transformers' model loading): a module shadowed by another on the path, or a broken install, is
   named here instead of failing five stages one by one;
2. the checkpoint folder (PACORE_GPU_CHECKPOINT): one the check did not create is refused, since the
   check writes its random shards, config and tokenizer there (bench/gpu/checkpoint.py);
3. nvidia-smi, the disk of each FOLDER, the versions, and the device with its free memory.
"""
from __future__ import annotations

import importlib
import importlib.util
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# module[:attribute] each stage needs; transformers' loading modules are the ones a stale or shadowed
# install breaks (the logits check loads transformers' model from the checkpoint); hub_kernels imports
# Hugging Face's `kernels`, which a package of that name on the path once shadowed.
IMPORTS = ("torch", "triton", "safetensors", "transformers:AutoModelForCausalLM", "transformers.modeling_utils",
           "transformers.integrations.hub_kernels",
           "transformers:Qwen3Config", "engine:LLM", "engine.worker.loader", "pacore_kernels", "pacore_kernels.fp8_gemm",
           "bench.gpu.e2e")
OURS = ("engine", "pacore_kernels", "bench")  # must come from this repository


def _origin(name: str) -> str:
    """Where `import name` finds it (a module that failed as it loaded is no longer in sys.modules)."""
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # a parent that does not import
        spec = None
    return (spec.origin or str(list(spec.submodule_search_locations or []))) if spec else "not found"


def check_imports() -> str | None:
    """None when every module of IMPORTS imports, ours from ROOT; else one line naming the first that does not."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    for spec in IMPORTS:
        name, _, attr = spec.partition(":")
        what = f"from {name} import {attr}" if attr else f"import {name}"
        try:
            module = importlib.import_module(name)
            if attr:
                getattr(module, attr)
        except Exception as e:  # an ImportError, or whatever a broken module raises as it loads
            top = name.split(".")[0]
            return (f"preflight: `{what}` fails ({type(e).__name__}: {str(e)[:300]}); {top} is {_origin(top)}: "
                    f"fix or remove that install, or the PYTHONPATH entry that shadows it")
    for name in OURS:
        where = Path(getattr(sys.modules[name], "__file__", None) or "?").resolve()
        if ROOT not in where.parents:
            return (f"preflight: `import {name}` found {where}, not this repository's ({ROOT}); remove what "
                    f"shadows it from PYTHONPATH or uninstall it")
    return None


def preflight(need_cuda: bool, folders: list[str], checkpoint: str | None = None) -> int:
    if (why := check_imports()) is not None:
        print(why)
        return 2
    from bench.gpu.checkpoint import foreign_folder
    if checkpoint is not None and (why := foreign_folder(checkpoint)) is not None:
        print(f"preflight: {why}")
        return 2
    import torch
    for cmd in (["nvidia-smi"], ["df", "-h", ".", *[f for f in folders if Path(f).is_dir()]]):
        if shutil.which(cmd[0]) is None:
            print(f"{cmd[0]}: not found")
            continue
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        print(proc.stdout.rstrip() or proc.stderr.rstrip())
    for f in folders:  # the checkpoint is written there: 16.4 GB
        if Path(f).is_dir() and shutil.disk_usage(f).free < 20e9:
            print(f"warning: {f} has {shutil.disk_usage(f).free / 1e9:.1f} GB free; the random checkpoint needs "
                  f"16.4 GB (set PACORE_GPU_CHECKPOINT to a folder on a larger disk)")
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "transformers", "pytest"):
        try:
            versions[name] = __import__(name).__version__
        except Exception as e:  # pytest: reported, not fatal (only `more`'s kernel tests need it)
            versions[name] = f"missing ({type(e).__name__})"
    print("  ".join(f"{k} {v}" for k, v in versions.items()))
    if not torch.cuda.is_available():  # the versions and the device last: the stage's log tail shows them
        print("no CUDA device" + ("" if need_cuda else " (dry run: CPU)"))
        return 2 if need_cuda else 0
    free, total = torch.cuda.mem_get_info()
    print(f"{torch.cuda.get_device_name()}: {free / 1e9:.1f} of {total / 1e9:.1f} GB free, "
          f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    return 0


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    need_cuda = "--dry-run" not in args
    args = [a for a in args if a != "--dry-run"]
    checkpoint = None
    if "--checkpoint" in args:
        i = args.index("--checkpoint")
        if i + 1 >= len(args):
            print("--checkpoint needs a folder", file=sys.stderr)
            return 2
        checkpoint = args.pop(i + 1)
        args.pop(i)
    return preflight(need_cuda, args, checkpoint)


if __name__ == "__main__":
    sys.exit(main())
