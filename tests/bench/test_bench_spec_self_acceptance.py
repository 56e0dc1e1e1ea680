"""bench.spec_self_acceptance --quick: self-drafting's acceptance profile has its shape, agrees with a real
engine run, a window over the whole context drafts the model itself, and the rehearsal reads it back."""
import json

import pytest

from bench.rehearsal.__main__ import main as rehearsal_main
from bench.spec_self_acceptance import main
from engine.rehearsal.drafter import load_self_window


def test_quick_profile_has_its_shape_and_the_rehearsal_reads_it(tiny_model_dir, tmp_path):
    out = tmp_path / "acc"
    assert main(["--quick", "--model", str(tiny_model_dir("qwen3_sharp")), "--out", str(out)]) == 0
    sec = json.loads((out / "profile.json").read_text())["self_window"]
    report = json.loads((out / "report.json").read_text())
    contexts = [b["context"] for b in report["bins"]]
    assert len(contexts) == 2 and contexts[0][1] == contexts[1][0]  # two adjacent bins
    for b in report["bins"]:  # each measured contexts of its own range (--quick used to label one it never did)
        assert b["context"][0] <= b["prompt_tokens"] < b["context"][1]
    assert "135M" in sec["note"] and sec["full_window_max_abs_diff"] < 1e-5
    for temp in ("1.0", "0.6"):
        for rule in ("coupled", "rejection", "inverse_cdf"):
            for ws in ("16/16", "64/16", "512/16"):
                bins = sec["profiles"][temp][rule][ws]
                assert [b["context"] for b in bins] == contexts
                for b in bins:
                    assert len(b["accept"]) == len(b["tokens_per_verify"]) == 4 and b["chunks"] > 0
                    assert all(0 <= a <= 1 for a in b["accept"])
                    assert b["tokens_per_verify"] == sorted(b["tokens_per_verify"]) and b["tokens_per_verify"][0] >= 1
    # rejection accepts at least what coupled does, position by position (min(1, q/p) >= 1 / sum_j max(p_j, q_j p/q))
    for temp in ("1.0", "0.6"):
        for c, r in zip(sec["profiles"][temp]["coupled"]["64/16"], sec["profiles"][temp]["rejection"]["64/16"]):
            assert r["tokens_per_verify"][-1] >= c["tokens_per_verify"][-1] - 1e-9
    check = report["check"]
    assert check["coupled"]["same_as_plain"] == check["coupled"]["trajectories"]  # coupled: plain decoding's tokens
    for rule in ("coupled", "rejection"):
        assert check[rule]["counters"]["spec_decode_num_drafts"] > 0
        # the engine's own acceptance of the first draft is the figure's, up to sampling noise
        assert check[rule]["run"][0] == pytest.approx(check["predicted"][rule]["run"][0], abs=0.25)
    # a wider window drafts closer to the model (the widest covers these contexts)
    for temp in ("1.0", "0.6"):
        tpv = [sec["profiles"][temp]["rejection"][ws][1]["tokens_per_verify"][-1] for ws in ("16/16", "512/16")]
        assert tpv[1] > tpv[0]

    profile = load_self_window(out / "profile.json", 512, 16, "coupled", temperature=0.7)
    assert profile.bounds == tuple(contexts[1]) and profile.at(100) == profile.accept[0] and profile.at(10**6) == profile.accept[1]
    with pytest.raises(ValueError, match="window 256 and sink 16"):
        load_self_window(out / "profile.json", 256, 16, "coupled", temperature=1.0)
    r, device = tmp_path / "r", tmp_path / "kv_bound.json"
    device.write_text('{"attention_bw_eff": 0.001, "step_overhead_s": 0}')  # drafting pays past the window
    assert rehearsal_main(["--shape", "tiny", "--preset", "low", "--problems", "1", "--prompt-tokens", "64",
                           "--mean-tokens", "2000", "--conclusion-tokens", "20", "--kv-tokens", "20000",
                           "--config", "engine", "--config", "spec-self", "--spec-profile", str(out / "profile.json"),
                           "--device", str(device), "--out", str(r), "--quiet"]) == 0
    engine, spec = (json.loads((r / n / "report.json").read_text()) for n in ("engine", "spec-self"))
    assert spec["overall"]["tokens"] == engine["overall"]["tokens"]
    assert spec["spec"]["spec_decode_num_drafts"] > 0 and spec["overall"]["draft_seconds"] > 0
    assert spec["steps"] < engine["steps"] and spec["overall"]["seconds"] < engine["overall"]["seconds"]
    assert 0 < sum(spec["spec"]["spec_decode_depth_steps"].values()) <= spec["steps"]  # the policy chose each step's depth


def test_acceptance_chances_are_the_rules_own():
    """Each rule's closed form against draws of the rule itself, on a small vocabulary: the engine's
    Gumbel-max draws with one key (pacore_kernels/gumbel_sample.py), speculative sampling's min(1, q/p),
    inverse-CDF coupling with one uniform."""
    import torch

    from bench.spec_self_acceptance import acceptance
    from pacore_kernels.gumbel_sample import gumbel_argmax_ref
    g = torch.Generator().manual_seed(0)
    p, q = (torch.softmax(torch.randn(1, 6, generator=g, dtype=torch.float64) * 1.5, -1) for _ in range(2))
    n = 400_000
    u = torch.rand(n, generator=g, dtype=torch.float64)
    target = torch.searchsorted(p.cumsum(-1)[0], u, right=True).clamp(max=5)
    coupled = torch.searchsorted(q.cumsum(-1)[0], u, right=True).clamp(max=5)
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (n,), dtype=torch.int64, generator=g)
    t_g, d_g = (gumbel_argmax_ref(x.log().float().expand(n, -1), keys) for x in (p, q))
    d = torch.multinomial(q[0].float(), n, replacement=True, generator=g)
    keep = torch.rand(n, generator=g, dtype=torch.float64) < (p[0, d] / q[0, d]).clamp(max=1)
    for y in range(6):
        a = acceptance(p, q, torch.tensor([y]))
        assert a["inverse_cdf"].item() == pytest.approx((coupled[target == y] == y).double().mean().item(), abs=0.01)
        assert a["coupled"].item() == pytest.approx((d_g[t_g == y] == y).double().mean().item(), abs=0.01)
        # speculative sampling emits y from an accepted draft with chance min(p, q)(y), y itself with p(y)
        assert a["rejection"].item() * p[0, y].item() == pytest.approx((keep & (d == y)).double().mean().item(), abs=0.004)
