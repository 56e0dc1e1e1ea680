"""How the packages hang together: `pacore --help` without torch, no import cycles, no benchmark
imported by the engine or the PaCoRe loop."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_cli_loads_no_torch():
    code = ("import sys, pacore.cli; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'engine'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_answers_without_torch():
    code = ("import sys, pacore.cli\n"
            "try:\n    pacore.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False") and "pacore run" in out.stdout


def _local_imports(package: str) -> dict[str, set[str]]:
    """module -> modules of the same package it imports (any import statement, lazy ones too)."""
    graph = {}
    for path in (ROOT / package).glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                deps.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(package + "."):
                deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith(package + ".")}
        graph[path.stem] = deps - {path.stem}
    return graph


@pytest.mark.parametrize("package", ["engine", "kernels", "pacore", "bench"])
def test_no_import_cycles_within_a_package(package):
    graph = _local_imports(package)
    done: set[str] = set()

    def visit(module, stack):
        assert module not in stack, f"import cycle: {' -> '.join(stack[stack.index(module):] + [module])}"
        if module in done:
            return
        for dep in graph.get(module, ()):
            visit(dep, stack + [module])
        done.add(module)
    for module in graph:
        visit(module, [])


def test_engine_and_pacore_import_no_benchmark():
    for package in ("engine", "pacore"):
        for path in (ROOT / package).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                assert not any(n == "bench" or n.startswith("bench.") for n in names), f"{path} imports bench"
