"""How the packages hang together: `pacore --help` without torch, no import cycles, no benchmark
imported by the engine or the PaCoRe loop."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_cli_loads_no_torch():
    code = ("import sys, pacore.cli; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'engine'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_answers_without_torch():
    code = ("import sys, pacore.cli\n"
            "try:\n    pacore.cli.main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False") and "pacore run" in out.stdout


def test_checking_the_engine_options_loads_no_torch():
    # `pacore run` refuses bad flags (a bad --speculative-config key among them) before torch loads
    code = ("import sys; from pacore.config import RunConfig; "
            "RunConfig('d', 'o', engine_options={'speculative_config': {'num_speculative_tokens': 3}}); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports, absolute names (any import statement, lazy ones too)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def _import_graph(packages) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` it imports, over every file of every subpackage. Importing
    ``a.b.c`` runs ``a`` and ``a.b`` first, so a module also depends on the packages above what it imports."""
    files = {_module_name(path): path for package in packages for path in (ROOT / package).rglob("*.py")}
    graph = {}
    for module, path in files.items():
        deps = set()
        for name in _imports(path):
            parts = name.split(".")
            deps |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & files.keys()
        # a package's own __init__ and those above it run before it: not a cycle
        graph[module] = {d for d in deps if not (module == d or module.startswith(d + "."))}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module, stack):
        if module in stack:
            return stack[stack.index(module):] + [module]
        if module in done:
            return None
        for dep in sorted(graph.get(module, ())):
            found = visit(dep, stack + [module])
            if found:
                return found
        done.add(module)
        return None
    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_import_graph(["engine", "pacore_kernels", "pacore", "bench"]))
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_sees_a_cycle_across_subpackages():
    graph = _import_graph(["engine", "pacore_kernels", "pacore", "bench"])
    assert "pacore.cli.run" in graph["pacore.cli"] and "engine.serve.command" in graph["pacore.cli"]
    # the CLI <-> serve-command cycle this layout ended, put back
    graph["engine.serve.command"] = graph["engine.serve.command"] | {"pacore.cli"}
    assert _cycle(graph) is not None


def test_engine_and_pacore_import_no_benchmark():
    for package in ("engine", "pacore"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                assert not any(n == "bench" or n.startswith("bench.") for n in names), f"{path} imports bench"


def _runtime_imports(path: Path) -> set[str]:
    """The absolute engine modules ``path`` imports when it runs (lazy ones too), not those it names for
    type checking alone (``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    return {node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and id(node) not in typing_only}


def test_the_engine_folders_import_each_other_without_a_cycle():
    # engine/ is grouped by role (docs/architecture.md): core, sample, worker, parallel, ... A folder leans on
    # the folders below it (worker on core, sample and parallel), never back up, so each can be read alone.
    folders = {p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").is_file()}
    graph = {f: set() for f in folders}
    for f in folders:
        for path in (ROOT / "engine" / f).rglob("*.py"):
            graph[f] |= {m.split(".")[1] for m in _runtime_imports(path)
                         if m.startswith("engine.") and m.split(".")[1] in folders} - {f}
    cycle = _cycle(graph)
    assert cycle is None, f"engine folders import each other in a cycle: {' -> '.join(cycle)}"
