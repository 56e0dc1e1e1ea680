"""`pacore --help` and the CLI's argument checks answer without loading torch or the engine."""
import subprocess
import sys


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
