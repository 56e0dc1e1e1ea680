"""bench.gpu.e2e --tiny: the engine stages' code path on CPU (a tiny random YaRN Qwen3, every section), the
graph-capture fallback, a cut checkpoint write, and the logits rule against transformers."""
import json

import pytest
import torch

from bench.gpu import e2e as gpu_e2e
from bench.gpu.e2e import main
from bench.gpu.logits import logits_check


def test_tiny_runs_every_section(tmp_path):
    assert main(["--tiny", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_e2e.json").read_text())
    assert not [k for k in report if k.endswith("_error")] and "graph_capture_errors" not in report
    assert report["load"]["kv_tokens"] > 0 and report["load"]["weights_GB"] > 0
    # one engine (cascade on) against transformers fp32, teacher-forced on each child's sampled tokens
    logits = report["logits"]
    assert logits["passed"] and logits["cascade"] and logits["positions"] == 2 * 4 * 24
    assert logits["clear_mismatches"] == 0 and logits["top1_agree"] == 1.0 and logits["max_abs_err"] < 1e-4
    rows = report["throughput"]
    assert {(r["case"], r["cascade"]) for r in rows} == {(c, on) for c in ("round1", "round2", "past_64k")
                                                        for on in (True, False)}
    for r in rows:
        assert r["decode_tok_s"] > 0 and r["gen_tokens"] == r["problems"] * r["n"] * 8
        # forced on (forks sharing a prompt): every decode step uses cascade; off: none does
        assert (r["cascade_steps"] == r["decode_steps"]) if r["cascade"] else r["cascade_steps"] == 0
        # the step split: host parts measured; no CUDA events on a CPU, so no GPU part and no share
        step = r["steps"]["decode"]
        assert step["steps"] == r["decode_steps"] and step["prepare_ms"] > 0 and step["gpu_ms"] is None
        assert step["schedule_ms"] + step["model_ms"] + step["sample_ms"] == pytest.approx(step["wall_ms"])
        assert r["forwards"]["decode"]["calls"] == r["decode_steps"]
    long = report["past_64k_logits"]
    assert long["first_position"] > 1024 and long["passed"]  # past the YaRN original context
    # speculation end to end: self-drafting runs draft and verify forwards, n-gram verify ones
    spec = {r["method"]: r for r in report["spec"]}
    assert set(spec["self_window"]["forwards"]) == {"draft", "verify"}
    assert "verify" in spec["ngram"]["forwards"] and "spec" in spec["ngram"]["steps"]
    verify = spec["self_window"]["forwards"]["verify"]
    assert verify["tokens"] > verify["rows"]  # several queries a row
    assert report["hf"]["tok_s"] > 0 and report["hf"]["engine_vs_hf"] > 0
    params = json.loads((tmp_path / "device_params.json").read_text())["engine"]
    assert {"load_s", "kv_tokens", "decode_tok_s", "steps", "hf_generate_tok_s", "engine_vs_hf",
            "decode_tok_s_fp8_e4m3", "kv_tokens_fp8_e4m3"} <= set(params)
    assert {"round1_cascade", "spec_self_window", "spec_ngram"} <= set(params["steps"])
    assert set(params["decode_tok_s_fp8_e4m3"]) == {"round1_cascade", "round2_cascade"}
    assert {r["kv_dtype"] for r in rows} == {"float32"}  # the tiny model's own dtype (auto)
    fp8 = report["fp8"]
    assert [r["case"] for r in fp8] == ["round1", "round2"]
    for r in fp8:
        assert r["kv_dtype"] == "fp8_e4m3" and r["kv_bytes_per_token"] == 2 * 2 * 2 * 32  # layers x K,V x Hkv x D
        assert r["decode_tok_s"] > 0 and r["decode_vs_auto"] > 0 and r["cascade_steps"] == r["decode_steps"]


def test_a_failed_graph_capture_is_recorded_and_the_engine_runs_eagerly(tmp_path, monkeypatch):
    real = gpu_e2e.Run.engine

    def engine(self, **kw):  # what LLM() raises when capturing the decode graphs fails
        if not kw.get("enforce_eager"):
            raise RuntimeError("capturing the decode CUDA graphs failed (CUDA error: operation not permitted when "
                               "stream is capturing); run without them: LLM(..., enforce_eager=True)")
        return real(self, **kw)
    monkeypatch.setattr(gpu_e2e.Run, "engine", engine)
    assert main(["--tiny", "--only", "checkpoint,logits", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_e2e.json").read_text())
    assert report["logits"]["passed"] and report["logits"]["graphs"] is False
    [err] = report["graph_capture_errors"]
    assert err["engine"] == "logits" and "operation not permitted" in err["error"]


def test_the_fallback_frees_the_failed_engine_before_it_retries(tmp_path, monkeypatch):
    """The failed LLM() is out of reach (its KV cache collected) when the eager retry starts: an `except`
    block's traceback would still hold its frames, and with them ~133 GB on an H200."""
    import weakref
    real, seen = gpu_e2e.Run.engine, {}

    def engine(self, **kw):
        if kw.get("enforce_eager"):
            seen["kv alive at the retry"] = seen["kv"]() is not None
            return real(self, **kw)
        llm = real(self, **dict(kw, enforce_eager=True))  # a real engine, as LLM() holds it when capture fails
        seen["kv"] = weakref.ref(llm.runner.kv_cache)
        raise RuntimeError("capturing the decode CUDA graphs failed (OutOfMemoryError); run without them")
    monkeypatch.setattr(gpu_e2e.Run, "engine", engine)
    assert main(["--tiny", "--only", "checkpoint,logits", "--out", str(tmp_path)]) == 0
    assert seen["kv alive at the retry"] is False
    assert json.loads((tmp_path / "gpu_e2e.json").read_text())["logits"]["passed"]


def test_a_folder_the_check_did_not_create_is_refused_not_written(tmp_path, capsys):
    model = tmp_path / "PaCoRe-8B"  # a downloaded model
    model.mkdir()
    files = {"config.json": b"{}", "model.safetensors": b"weights", "tokenizer.json": b"{}"}
    for name, data in files.items():
        (model / name).write_bytes(data)
    out = tmp_path / "out"
    assert main(["--tiny", "--only", "checkpoint", "--checkpoint", str(model), "--out", str(out)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"PACORE_GPU_CHECKPOINT={model} holds files this check did not write" in line and "new or empty" in line
    assert {p.name: p.read_bytes() for p in model.iterdir()} == files  # nothing written, nothing changed
    from bench.gpu.checkpoint import foreign_folder
    assert foreign_folder(tmp_path / "new") is None and foreign_folder(model) == line.removeprefix("gpu_e2e: ")


def test_a_cut_checkpoint_write_is_reported_not_redone(tmp_path):
    from bench.gpu.checkpoint import OWNER_MARK
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / OWNER_MARK).write_text("")  # the check created it
    (ckpt / "model.safetensors").write_bytes(b"half a shard")  # the write was cut: no `complete` marker
    out = tmp_path / "out"
    assert main(["--tiny", "--only", "throughput", "--checkpoint", str(ckpt), "--out", str(out)]) == 1
    error = json.loads((out / "gpu_e2e.json").read_text())["checkpoint_error"]
    assert "its write (the `checkpoint` stage) was cut or failed" in error and "--only checkpoint" in error
    assert sorted(p.name for p in ckpt.iterdir()) == [OWNER_MARK, "model.safetensors"]  # nothing rewritten
    with pytest.raises(SystemExit):
        main(["--tiny", "--only", "throughputs"])  # a typo is refused, naming the sections


def test_logits_check_compares_tokens_only_where_the_margin_is_clear():
    hf = torch.tensor([[5.0, 1.0, 0.0], [3.0, 2.999, 0.0]])
    near = hf + torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.002, 0.0]])  # position 1's top two swap within the difference
    r = logits_check(list(near), [0, 1], hf, tol=1e-2)
    assert r["passed"] and r["clear_positions"] == 1 and r["top1_agree"] == 0.5
    r = logits_check(list(hf), [1, 0], hf, tol=1e-2)  # equal logits, another token where the margin is clear: a bug
    assert not r["passed"] and r["clear_mismatches"] == 1
    r = logits_check(list(hf + torch.tensor([0.0, 0.2, 0.0])), [0, 0], hf, tol=1e-2)  # same tokens, logits too far
    assert not r["passed"] and r["clear_mismatches"] == 0 and r["max_rel_err"] > 1e-2
