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
