"""bench.pacore_throughput --quick says, in its output and its JSON, that its ratios are not the
published ones (docs/performance.md says why)."""
import pytest

import bench.pacore_throughput as tp
import bench.plots


@pytest.mark.parametrize("quick", [True, False])
def test_quick_says_its_ratios_are_not_the_published_ones(quick, monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr(tp, "run", lambda args: seen.update(args=args) or {"workload": {}})
    monkeypatch.setattr(bench.plots, "write_throughput_report", lambda data, out: seen.update(data=data) or "TABLE")
    assert tp.main(["--out", str(tmp_path)] + (["--quick"] if quick else [])) == 0
    out = capsys.readouterr().out
    assert ("not the published ones" in out) == quick and seen["data"]["workload"]["quick"] == quick
    assert (seen["args"].problems, seen["args"].gen_len) == ((2, 32) if quick else (4, 128))
    assert "not the published ones" in tp.QUICK_NOTE


def test_the_docs_say_so_too():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "performance.md").read_text()
    assert "`--quick` ratios are not the published ones" in page
