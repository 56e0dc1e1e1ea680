"""bench.spec_layerskip_acceptance --quick on a tiny model: the self_layerskip section has the shape the
rehearsal reads (per kept/total count, per bin: the layer-skip and full-depth acceptance, tokens per verify
[full depth, layer skip] at 4 and 6 drafts)."""
import json

from bench.spec_layerskip_acceptance import main, variants


def test_variants_label_the_default_choice_and_the_spread_comparison():
    v = variants(30, [0.75, 0.5], [0.75])
    assert list(v) == ["30/30", "22/30", "15/30", "22/30 spread"]
    assert v["30/30"] is None and v["22/30"] == tuple(range(11)) + tuple(range(19, 30))
    assert len(v["22/30 spread"]) == 22 and v["22/30 spread"][0] == 0 and v["22/30 spread"][-1] == 29


def test_quick_run_writes_the_self_layerskip_section(tiny_model_dir, tmp_path):
    out = tmp_path / "layerskip"
    assert main(["--quick", "--model", str(tiny_model_dir("qwen3_sharp")), "--out", str(out)]) == 0
    sec = json.loads((out / "profile.json").read_text())["self_layerskip"]
    assert sec["layers"] == 2 and "135M" in sec["note"] and sec["command"].startswith("python -m bench.")
    report = json.loads((out / "report.json").read_text())
    contexts = [b["context"] for b in report["bins"]]
    assert len(contexts) == 2
    bins = sec["profiles"]["1.0"]["coupled"]["1/2"]
    assert [b["context"] for b in bins] == contexts
    for b in bins:
        assert b["window"] == "64/16" and len(b["accept"]) == len(b["accept_full"]) == 6
        assert all(0 <= a <= 1 for a in b["accept"] + b["accept_full"])
        assert set(b["tokens_per_verify"]) == {"4", "6"}
        for full, skip in b["tokens_per_verify"].values():
            assert full >= 1 and skip >= 1
    assert "| 1/2 |" in (out / "table.md").read_text()
