"""Model and engine configuration: what the decoder needs from a Hugging Face folder, checked.

Past 300 lines because the engine's flags are derived from EngineConfig's fields here, beside them.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.worker.checkpoint_checks import check_config, eos_token_ids, generation_eos
from engine.jsonfile import loads_json, read_json
from engine.quant.config import QUANTIZATIONS, Fp8Config, checkpoint_quantization, resolve_quantization

if TYPE_CHECKING:  # torch is imported where it is used: `pacore --help` reads the flags below without it
    import torch

# One decoder covers all three; the flags below say where they differ.
SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
SUPPORTED_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}
DTYPES = ("float32", "bfloat16", "float16")  # torch dtype names
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other spellings
# KV cache formats (vLLM's names): "auto" is the model's dtype; the FP8 ones store K and V in one byte.
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
KV_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}  # vLLM's usual spelling: e4m3 on CUDA
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vLLM's --block-size choices
# Which distribution logprobs report (vLLM's names; engine/sample/logprobs.py).
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
CASCADE_SCOPES = ("request", "batch")  # cascade_scope: a request's own rows, or a prefix common to the whole step


@dataclass(slots=True)
class ModelConfig:
    path: Path
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool          # Qwen2; Llama's attention_bias
    o_bias: bool            # Llama's attention_bias also biases o_proj
    mlp_bias: bool
    qk_norm: bool           # Qwen3: per-head RMSNorm on q and k before RoPE
    rope_type: str
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None
    hf_config: object = None  # the transformers config, for RoPE parameter functions
    quant: Fp8Config | None = None  # FP8 projections (engine/quant/): asked for, or the checkpoint's

    @classmethod
    def from_pretrained(cls, path: str | Path, rope_scaling: dict | None = None,
                        quantization: str | None = None) -> "ModelConfig":
        """Read and check ``path``'s config.json; ``quantization``: "fp8" to quantize the projections at
        load (a pre-quantized FP8 checkpoint runs in its own format either way)."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(
                f"{path} has no config.json: pass a local Hugging Face model folder "
                "(config.json, *.safetensors, tokenizer files) or 'smollm2-135m' for the embedded model")
        raw = check_config(read_json(cfg_file), cfg_file)  # engine/worker/checkpoint_checks.py
        quant = resolve_quantization(quantization, checkpoint_quantization(raw, cfg_file), cfg_file)
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs} in {cfg_file}: this engine runs "
                f"{sorted(SUPPORTED_ARCHITECTURES)}")
        from transformers import AutoConfig
        try:
            hf = AutoConfig.from_pretrained(path)
        except Exception as e:  # what the checks above let through, transformers' validators refuse: said in one line
            said = " ".join(str(e).split())[:300] or type(e).__name__
            raise ValueError(f"{cfg_file}: transformers cannot read it ({said}); fix it there") from None
        if getattr(hf, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={hf.hidden_act!r} in {cfg_file}: only 'silu' MLPs are implemented")
        layer_types = getattr(hf, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types) or getattr(hf, "use_sliding_window", False):
            raise ValueError(f"{cfg_file} asks for sliding-window attention, which this engine does not implement")
        if rope_scaling is not None:
            hf.rope_parameters = merged_rope_parameters(hf, rope_scaling)
        rope = getattr(hf, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope type {rope_type!r} in {cfg_file} is not supported "
                             f"(supported: {sorted(SUPPORTED_ROPE_TYPES)})")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"partial_rotary_factor in {cfg_file} is not supported")
        num_heads = hf.num_attention_heads
        num_kv_heads = getattr(hf, "num_key_value_heads", None) or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} attention heads are not a multiple of {num_kv_heads} KV heads")
        eos_ids = eos_token_ids(raw.get("eos_token_id"), cfg_file)
        gen_file = path / "generation_config.json"
        if gen_file.is_file():
            eos_ids = generation_eos(gen_file, eos_ids)
        attention_bias = bool(getattr(hf, "attention_bias", False))
        return cls(
            path=path, architecture=arch, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size, num_layers=hf.num_hidden_layers,
            num_heads=num_heads, num_kv_heads=num_kv_heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // num_heads,
            rms_norm_eps=hf.rms_norm_eps, max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
            o_bias=arch == "LlamaForCausalLM" and attention_bias,
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            rope_type=rope_type, eos_token_ids=eos_ids,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "") or None,
            hf_config=hf, quant=quant,
        )

    def rope_cos_sin(self, max_positions: int) -> torch.Tensor:
        """fp32 [max_positions, head_dim]: cos | sin, scaling and attention factor folded in."""
        import torch
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        hf = self.hf_config
        if self.rope_type == "default":
            base = hf.rope_parameters["rope_theta"]
            inv_freq = 1.0 / (base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))
            scale = 1.0
        else:
            inv_freq, scale = ROPE_INIT_FUNCTIONS[self.rope_type](hf, "cpu")
        # Same op order as transformers (fp32 product per position) so cos/sin match bit for bit.
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq.float()[None, :]
        return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)


def merged_rope_parameters(hf, rope_scaling: dict) -> dict:
    """The checkpoint's RoPE parameters with ``rope_scaling`` laid over them (vLLM's override).

    Keys not given (rope_theta above all) keep the checkpoint's values; the legacy key "type" is
    read as "rope_type". Pass the result to transformers as ``rope_parameters`` for a reference.
    """
    if not isinstance(rope_scaling, dict) or not rope_scaling:
        raise ValueError(f"rope_scaling must be a non-empty dict such as {{'rope_type': 'yarn', 'factor': 2.0, "
                         f"'original_max_position_embeddings': 65536}}, got {rope_scaling!r}")
    override = dict(rope_scaling)
    if "type" in override:
        override.setdefault("rope_type", override.pop("type"))
    if override.get("rope_type") not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_scaling: rope_type must be one of {sorted(SUPPORTED_ROPE_TYPES)}, "
                         f"got {override.get('rope_type')!r}")
    return {**(getattr(hf, "rope_parameters", None) or {}), **override}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        if dtype not in {getattr(torch, name) for name in DTYPES}:
            raise ValueError(f"dtype {dtype} is not supported; use one of {list(DTYPES)}")
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {list(DTYPES)} or 'auto'")
    return getattr(torch, dtype)


# -- command-line flags: argparse types (shared with pacore's own flags) ---------------------------
_YARN_EXAMPLE = '{"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 65536}'
_SPEC_EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4}'


def _number(value: str, cast: type, bad: str, ok, out_of_range: str):
    """Parse ``value`` with ``cast`` for argparse, naming what was expected (``bad``) and the range."""
    try:
        n = cast(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{bad}, got {value!r}") from None
    if not ok(n):
        raise argparse.ArgumentTypeError(out_of_range.format(value=value))
    return n


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    return _number(value, int, "must be a positive integer", lambda n: n >= 1, "must be a positive integer")


def nonnegative_int(value: str) -> int:
    """argparse type: an integer >= 0."""
    return _number(value, int, "must be an integer >= 0", lambda n: n >= 0, "must be an integer >= 0, got {value}")


def seed_int(value: str) -> int:
    """argparse type: a seed in [0, 2**64)."""
    return _number(value, int, "expected an integer", lambda n: 0 <= n < 2**64, "must be in [0, 2**64), got {value}")


def seconds(value: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    return _number(value, float, "expected a number of seconds", lambda s: 0 <= s < float("inf"),
                   "must be a number of seconds >= 0, got {value}")


def json_object(value: str, example: str = _YARN_EXAMPLE) -> dict:
    """argparse type: a non-empty JSON object (``--rope-scaling``; ``example`` is shown when it is not)."""
    try:
        obj = loads_json(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({getattr(e, 'msg', e)}); quote it for the shell, e.g. "
                                         f"'{example}'") from None
    if not isinstance(obj, dict) or not obj:
        raise argparse.ArgumentTypeError(f"expected a non-empty JSON object such as '{example}', got {value}")
    return obj


def speculative_json(value: str) -> dict:
    """argparse type of ``--speculative-config``: a JSON object engine/spec/config.py accepts, so a bad key
    stops the command at once, named (torch-free)."""
    from engine.spec.config import SpeculativeConfig

    obj = json_object(value, _SPEC_EXAMPLE)
    try:
        SpeculativeConfig.from_dict(obj)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("speculative_config: ")) from None
    return obj


def dtype_name(value: str) -> str:
    """argparse type of ``--dtype``: vLLM's spellings (half, float) as torch's names."""
    return DTYPE_ALIASES.get(value, value)


def kv_cache_dtype_name(value: str) -> str:
    """argparse type of ``--kv-cache-dtype``: vLLM's fp8 is fp8_e4m3."""
    return KV_CACHE_DTYPE_ALIASES.get(value, value)


def _flag(help: str, *, name: str | tuple[str, ...] | None = None, type=None, metavar: str | None = None,
          choices: tuple | None = None) -> dict:
    """Field metadata making an EngineConfig field a command-line flag (``--field-name`` unless ``name``;
    a tuple of names: the first is the flag, the others its aliases)."""
    return {"flag": {"name": name, "help": help, "type": type, "metavar": metavar, "choices": choices}}


def memory_fraction(value: str) -> float:
    """argparse type: a fraction in (0, 1] (``--gpu-memory-utilization``)."""
    return _number(value, float, "expected a number in (0, 1]", lambda x: 0 < x <= 1,
                   "must be in (0, 1], e.g. 0.9, got {value}")


@dataclass(slots=True)
class EngineConfig:
    """The options of ``LLM(model, **options)``, checked in one place.

    num_kv_blocks / kv_cache_memory: size the paged cache by blocks or bytes (default: 90% of free
    GPU memory after weights on CUDA, 2 GiB on CPU).
    max_model_len / rope_scaling: override the checkpoint's context and RoPE parameters (vLLM's
    ``--max-model-len`` / ``--rope-scaling``); rope_scaling keys are laid over the checkpoint's.
    long_prefill_token_threshold / max_num_seqs_per_request: each request's share of a step's token budget
    and of the seats while others wait (engine/core/fairness.py); 0 / max_num_seqs: first come, first served.
    cascade_attention: True/False forces prefix-shared decode attention on/off; None decides per step
    and group: >= cascade_min_group sequences sharing >= cascade_min_prefix tokens, with group size *
    prefix length >= cascade_min_shared_tokens, in a step where cascade skips at least
    cascade_min_saved_fraction of the KV the plain path would read (engine/core/cascade.py, CascadePolicy).
    cascade_scope: 'request' (a request's rows share its prompt, per group) or 'batch' (vLLM V1's: one
    prefix common to every sequence the step runs, whatever their request, else none).
    enable_fork=False turns a request with n=K into K independent prompts (an ablation).
    enforce_eager=True skips CUDA graphs (on CUDA, decode steps replay captured graphs by default).
    batch_invariant=True: a token's logits, hence seeded draws, do not depend on the batch, chunking,
    fork, preemption or resume (engine/worker/model_runner.py; slower, no cascade or graphs).
    tokenizer: a folder to load the tokenizer from (default: the model's); skip_tokenizer_init=True
    loads none (token ids in and out, no text).
    record_steps=True keeps a StepRecord per step in ``LLM.step_log``.
    tensor_parallel_size=N splits the model over N ranks (Megatron-style, engine/parallel/distributed.py):
    N GPUs from ``device`` on, or N processes on a CPU that share its cores (torch.set_num_threads).
    Rank 0 is this process; the others are worker processes the LLM starts and stops (``shutdown()``).
    kv_cache_dtype: 'auto' (the model's dtype), 'fp8_e4m3' or 'fp8_e5m2': K and V stored in one byte
    each, half the bytes of bf16, so the same memory holds twice the tokens. Per-layer scales come
    from the checkpoint (``self_attn.k_scale`` / ``v_scale``, llm-compressor's ``k_proj.output_scale``)
    or are 1.0; values beyond the format's range saturate (engine/worker/kv_cache.py).
    quantization: None (the checkpoint's format) or 'fp8' (vLLM's): the attention and MLP projections in
    FP8 e4m3, quantized at load with per-channel scales; a pre-quantized FP8 checkpoint (quant_method
    'fp8', e.g. 128x128 block scales) runs in its own format either way (engine/quant/).
    max_logprobs: the most top alternatives a request may ask for with SamplingParams.logprobs or
    prompt_logprobs (vLLM's, default 20). logprobs_mode: 'raw_logprobs' (the model's distribution,
    vLLM's default) or 'processed_logprobs' (the one sampled from, after temperature and filters);
    engine/sample/logprobs.py.
    speculative_config: speculative decoding, exact (engine/spec/config.py: method "ngram",
    num_speculative_tokens, prompt_lookup_min/max, lookup_siblings); None (default) decodes one token
    per row per step.
    device_model: rehearse on a modelled device ('h200', or a parameters JSON a GPU run of bench/
    wrote): no weights or KV tensors are allocated, each step advances a virtual clock by its
    modelled cost, and tokens follow ``llm.sampler.workload`` (engine/rehearsal/).
    """
    model: str | None = None
    dtype: str | torch.dtype | None = field(default=None, metadata=_flag(
        "weights/activations dtype: auto, float32, bfloat16, float16 (vLLM's half and float are read as float16 "
        "and float32; default auto: bfloat16 on a GPU, float32 on a CPU)", type=dtype_name,
        choices=("auto",) + DTYPES))
    device: str | torch.device | None = None
    tokenizer: str | None = field(default=None, metadata=_flag(
        "a folder to load the tokenizer from (vLLM's flag; default: the model's)", metavar="DIR"))
    skip_tokenizer_init: bool = False
    block_size: int = field(default=16, metadata=_flag(
        "tokens per KV-cache block (vLLM's flag and choices; default 16)", type=int, choices=BLOCK_SIZES))
    num_kv_blocks: int | None = field(default=None, metadata=_flag(
        "KV-cache size in blocks (default: sized by the engine)", type=positive_int, metavar="N"))
    kv_cache_memory: int | None = None
    kv_cache_dtype: str = field(default="auto", metadata=_flag(
        "KV cache format: auto (the model's dtype), fp8_e4m3 or fp8_e5m2 (one byte per value: twice the tokens "
        "in the same memory, half the bytes read per decode step; vLLM's --kv-cache-dtype, whose fp8 is fp8_e4m3; "
        "default auto)", type=kv_cache_dtype_name, choices=KV_CACHE_DTYPES))
    quantization: str | None = field(default=None, metadata=_flag(
        "weight format (vLLM's --quantization): fp8 stores the attention and MLP projections in FP8 e4m3 with "
        "per-channel scales, quantized at load (half the weight bytes read per step; embeddings, norms and the LM "
        "head stay in the model's dtype); a pre-quantized FP8 checkpoint runs in its own format without it (default: "
        "the checkpoint's format)",
        choices=QUANTIZATIONS))
    gpu_memory_utilization: float = field(default=0.9, metadata=_flag(
        "fraction of each GPU's memory the engine may fill, weights and KV cache together (vLLM's flag): the KV "
        "cache gets what is left of it once the weights are loaded; ignored on a CPU (default 0.9)",
        type=memory_fraction, metavar="F"))
    max_num_seqs: int = field(default=256, metadata=_flag(
        "most sequences (trajectories) decoded in one step (engine default 256)", type=positive_int, metavar="N"))
    max_num_batched_tokens: int = field(default=2048, metadata=_flag(
        "most tokens one engine step computes, prompt chunks and decode rows together (vLLM's flag; default 2048)",
        type=positive_int, metavar="N"))
    # Fairness (engine/core/fairness.py): one request must not hold up the others.
    long_prefill_token_threshold: int | None = field(default=None, metadata=_flag(
        "most prompt tokens one sequence prefills in a step while other prompts wait for the step (vLLM's flag); "
        "what they leave goes back to it (default: a quarter of the step's 2048 tokens; 0: no limit, first come "
        "first served)", type=nonnegative_int, metavar="N"))
    max_num_seqs_per_request: int | None = field(default=None, metadata=_flag(
        "most sequences one request keeps running while another request waits for a seat: its newest above that "
        "are preempted for the newcomer (default: --max-num-seqs less a sixteenth, at least one seat kept; "
        "--max-num-seqs: off)", type=positive_int, metavar="N"))
    max_model_len: int | None = field(default=None, metadata=_flag(
        "context limit in tokens, prompt + generation (default: the model's); 131072 for PaCoRe-8B as in the "
        "paper, with --rope-scaling", type=positive_int, metavar="N"))
    rope_scaling: dict | None = field(default=None, metadata=_flag(
        "RoPE parameters laid over the checkpoint's (vLLM's --rope-scaling), e.g. the paper's YaRN x2: "
        "'{\"rope_type\": \"yarn\", \"factor\": 2.0, \"original_max_position_embeddings\": 65536, "
        "\"attention_factor\": 1.0}' (default: the checkpoint's)", type=json_object, metavar="JSON"))
    enable_prefix_caching: bool = field(default=True, metadata=_flag(
        "share the KV blocks of prompt prefixes computed before (vLLM's flag; on by default: "
        "--no-enable-prefix-caching turns it off; fork shares a request's prompt either way)"))
    enable_fork: bool = True
    cascade_attention: bool | None = None
    cascade_min_group: int = 2
    cascade_min_prefix: int = 64
    cascade_min_shared_tokens: int = 1024
    cascade_min_saved_fraction: float = 0.05
    cascade_scope: str = "request"
    attention_backend: str | None = None
    enforce_eager: bool = field(default=False, metadata=_flag(
        "run decode steps eagerly instead of replaying CUDA graphs (vLLM's flag; for a GPU setup where "
        "capturing fails)"))
    batch_invariant: bool = field(default=False, metadata=_flag(
        "a token's logits do not depend on what else is batched, preemption or a restart, so seeded requests "
        "and resumed or re-batched runs draw exactly the same tokens (slower; see docs/guarantees.md)"))
    record_steps: bool = False
    seed: int = field(default=0, metadata=_flag(
        "engine seed for requests without one (default 0)", type=seed_int))
    tensor_parallel_size: int = field(default=1, metadata=_flag(
        "split each engine over T GPUs (LLM(tensor_parallel_size=T)); pacore run with --data-parallel D uses "
        "D x T GPUs (vLLM's name; --tensor-parallel is the same flag; default 1)",
        name=("--tensor-parallel-size", "--tensor-parallel"), type=positive_int, metavar="T"))
    max_logprobs: int = field(default=20, metadata=_flag(
        "most top alternatives a request may ask for per token (logprobs / top_logprobs / prompt_logprobs; "
        "vLLM's --max-logprobs, default 20; at most the model's vocabulary)", type=positive_int, metavar="N"))
    logprobs_mode: str = field(default="raw_logprobs", metadata=_flag(
        "which distribution logprobs come from: raw_logprobs (the model's, before temperature and top-k/top-p; "
        "vLLM's default) or processed_logprobs (the one sampled from); prompt logprobs are always raw",
        choices=LOGPROBS_MODES))
    speculative_config: dict | None = field(default=None, metadata=_flag(
        "speculative decoding, exact (vLLM's flag): e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
        "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5}' drafts from the prompt, the trajectory and its "
        "siblings; the tokens are those decoding without it draws (default: off)", type=speculative_json,
        metavar="JSON"))
    device_model: str | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "kv_cache_memory",
                     "max_model_len", "tensor_parallel_size", "max_logprobs", "max_num_seqs_per_request"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        t = self.long_prefill_token_threshold
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 0):
            raise ValueError(f"long_prefill_token_threshold must be an integer >= 0 (0: no limit), got {t!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not 0 <= self.cascade_min_saved_fraction <= 1:
            raise ValueError(f"cascade_min_saved_fraction must be in [0, 1], got {self.cascade_min_saved_fraction}")
        if self.cascade_scope not in CASCADE_SCOPES:
            raise ValueError(f"cascade_scope must be one of {list(CASCADE_SCOPES)}, got {self.cascade_scope!r}")
        self.kv_cache_dtype = KV_CACHE_DTYPE_ALIASES.get(self.kv_cache_dtype, self.kv_cache_dtype)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)} or None (the checkpoint's format), "
                             f"got {self.quantization!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {list(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")
        from engine.spec.config import SpeculativeConfig
        SpeculativeConfig.from_dict(self.speculative_config)  # refused here, naming the key
        if self.attention_backend not in (None, "torch", "triton"):
            raise ValueError(f"attention_backend must be 'torch', 'triton' or None, got {self.attention_backend!r}")


# The flags of `pacore run`, `demo` and `serve`, in their --help order; `serve` adds the engine's "seed"
# (`pacore run --seed` is the run's seed, which also seeds its engine).
ENGINE_FLAGS = ("dtype", "kv_cache_dtype", "quantization", "max_model_len", "rope_scaling", "max_num_seqs",
                "num_kv_blocks", "gpu_memory_utilization", "long_prefill_token_threshold", "max_num_seqs_per_request",
                "tensor_parallel_size", "batch_invariant", "enforce_eager", "max_logprobs", "logprobs_mode",
                "speculative_config")
_FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}


def add_engine_flags(group, names: tuple[str, ...] = ENGINE_FLAGS) -> None:
    """Add the EngineConfig fields ``names`` to an argparse parser or group as flags, derived from the
    fields (help text in their metadata, default the field's), as vLLM derives its flags from EngineArgs."""
    for name in names:
        f = _FIELDS[name]
        spec = f.metadata["flag"]
        flags = spec["name"] or "--" + name.replace("_", "-")
        flags = (flags,) if isinstance(flags, str) else flags
        if f.type == "bool":  # on by default: --no-NAME turns it off (vLLM's spelling)
            action = argparse.BooleanOptionalAction if f.default else "store_true"
            group.add_argument(*flags, dest=name, action=action, default=f.default, help=spec["help"])
            continue
        kwargs = {k: spec[k] for k in ("type", "metavar", "choices") if spec.get(k) is not None}
        group.add_argument(*flags, dest=name, default=f.default, help=spec["help"], **kwargs)


def engine_kwargs(args: argparse.Namespace, names: tuple[str, ...] = ENGINE_FLAGS) -> dict:
    """``LLM(**kwargs)`` from the flags ``add_engine_flags`` added: those left at their default are left
    out, for the engine to choose."""
    values = {name: getattr(args, name) for name in names}
    return {name: v for name, v in values.items() if v is not None and v != _FIELDS[name].default}
