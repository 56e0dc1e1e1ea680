"""The tree stays legible: no source file of the engine, kernels, PaCoRe loop or benches grows past the
limit the developers' guide sets (a file over it is split by moving what does not belong)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 450


def test_no_source_file_over_the_line_limit():
    over = {str(p.relative_to(ROOT)): n
            for folder in ("engine", "pacore_kernels", "pacore", "bench")
            for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > LIMIT}
    assert not over, f"over {LIMIT} lines (move what does not belong into a module of its own): {over}"


# The engine's tree shows its roles (issue 53; docs/architecture.md walks it): a folder per role, as vLLM v1
# names them, and at the top only the entry points. A new module goes into the folder of its role.
ENGINE_FOLDERS = {"core", "sample", "worker", "parallel", "spec", "quant", "serve", "rehearsal"}
ENGINE_TOP_LEVEL = {"__init__.py", "llm.py", "config.py", "chat.py", "context_length.py", "default_model.py",
                    "profiler.py", "jsonfile.py", "testing.py",
                    # a step's cost on a device: the depth policy (spec/) and the rehearsal both price by it, so it
                    # sits above both (in rehearsal/ it would make rehearsal and spec import each other)
                    "device_model.py"}


def test_the_engine_is_grouped_by_role():
    engine = ROOT / "engine"
    folders = {p.name for p in engine.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == ENGINE_FOLDERS
    assert all((engine / f / "__init__.py").is_file() for f in folders)
    top = {p.name for p in engine.glob("*.py")}
    assert top <= ENGINE_TOP_LEVEL, f"a module of a role at the top of engine/: {sorted(top - ENGINE_TOP_LEVEL)}"


def test_the_gpu_check_is_one_folder():
    assert not sorted((ROOT / "bench").glob("gpu_*")), "the GPU check's stages live in bench/gpu/"
    assert (ROOT / "bench/gpu/check.sh").is_file() and (ROOT / "bench/gpu/__init__.py").is_file()
