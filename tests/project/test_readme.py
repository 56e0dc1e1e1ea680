"""The README's set-up commands are the ones CI runs."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks if b.strip().startswith("python3 -m venv .venv")]


def test_two_setup_commands_both_use_repo_venv():
    cmds = _commands()
    assert len(cmds) == 2
    assert all(".venv/bin/" in c and "torch==2.13.0" in c for c in cmds)
    assert cmds[0].endswith("pacore demo") and "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[1] in ci.splitlines()
