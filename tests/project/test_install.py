"""What `pip install -e .` asks for: every extra a dependency is asked for is one the package provides
(pip warns "does not provide the extra" otherwise), and the base install has what the documented
commands import (the plots included)."""
import importlib.metadata
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
packaging_requirements = pytest.importorskip("packaging.requirements")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_requested_extra_is_provided_as_spelled():
    for spec in _project()["dependencies"]:
        req = packaging_requirements.Requirement(spec)
        if not req.extras:
            continue
        provided = importlib.metadata.metadata(req.name).get_all("Provides-Extra") or []
        # pip 23 compares the extra as written with the metadata's spelling
        assert req.extras <= set(provided), f"{spec}: {req.name} provides the extras {provided}"


def test_the_base_install_brings_the_plots():
    names = {re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0].lower() for d in _project()["dependencies"]}
    assert "matplotlib" in names  # bench.rehearsal, bench.pacore_throughput and --profile plot with it
