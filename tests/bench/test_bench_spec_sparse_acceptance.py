"""bench.spec_sparse_acceptance --quick on a tiny model: every policy measured in every cell, the sparse
ones reading no more than the window they are compared with."""
import json

from bench.spec_sparse_acceptance import configs, main, verify_section


def test_configs_split_each_budget_in_whole_blocks():
    assert configs([128, 512], [0.25, 0.5], 16) == [
        ("window 128", 128, 0, ""), ("window 32 + selected 96", 32, 96, "bounds"),
        ("window 64 + selected 64", 64, 64, "bounds"), ("window 32 + verify-selected 96", 32, 96, "verify"),
        ("window 64 + verify-selected 64", 64, 64, "verify"),
        ("window 512", 512, 0, ""), ("window 128 + selected 384", 128, 384, "bounds"),
        ("window 256 + selected 256", 256, 256, "bounds"), ("window 128 + verify-selected 384", 128, 384, "verify"),
        ("window 256 + verify-selected 256", 256, 256, "verify")]
    assert configs([16], [0.25], 16) == [("window 16", 16, 0, "")]  # no room for a block of selection


def test_quick_run_measures_every_policy(tiny_model_dir, tmp_path):
    out = tmp_path / "sparse"
    assert main(["--quick", "--model", str(tiny_model_dir("qwen3_sharp")), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    labels = [c[0] for c in report["configs"]]
    assert labels == ["window 64", "window 16 + selected 48", "window 32 + selected 32",
                      "window 16 + verify-selected 48", "window 32 + verify-selected 32"]
    assert len(report["bins"]) == 2
    for b in report["bins"]:
        for temp in ("1.0", "0.6"):
            t = b["by_temperature"][temp]
            assert t["chunks"] > 0 and set(t["policies"]) == set(labels)
            for rule in ("coupled", "rejection"):
                for s in (t["policies"][label][rule] for label in labels):
                    assert all(0 <= a <= 1 for a in s["accept"])
                    assert s["tokens_per_verify"] == sorted(s["tokens_per_verify"]) and s["tokens_per_verify"][0] >= 1
    assert "| window 16 + selected 48 |" in (out / "table.md").read_text()
    # spec_profile.json's self_verify section: self_sparse's shape, [window alone, verify-guided] per depth
    sec = verify_section(report)
    cells = sec["profiles"]["1.0"]["coupled"]["16/48/16"]
    assert [c["context"] for c in cells] == [b["context"] for b in report["bins"]]
    alone = report["bins"][0]["by_temperature"]["1.0"]["policies"]["window 64"]["coupled"]["tokens_per_verify"][3]
    assert cells[0]["window"] == "64/16" and cells[0]["tokens_per_verify"]["4"][0] == round(alone, 2)
