"""The device model of a rehearsal: what one planned step would cost on a GPU, from bytes and FLOPs.

A step's time is the sum of its parts, each at its own roofline:

- ``weights``: every linear weight (and the LM head) read once, bytes / (bandwidth x linear_bw_eff);
  with FP8 weights the projections are a byte per parameter plus their scales (engine/core/step_shape.py;
  their FLOPs are still charged at the bf16 peak);
- ``matmul``: the linear layers' compute beyond that read, max(0, FLOPs / (peak x matmul_eff) -
  weights), shared out by token: decode tokens' share here, prefill's in ``prefill``, recomputed
  tokens' in ``recompute``;
- ``kv_read``: decode attention's KV traffic, bytes / (bandwidth x attention_bw_eff), a cascade
  group's shared prefix counted once; the KV stores of the step's new tokens are counted here too. A
  verify row (speculative decoding: its last token and its d drafts) reads its KV once for its d + 1
  queries, and pays their FLOPs at prefill_attention_eff should they take longer than the read;
- ``attention``: prefill attention, max(FLOPs / (peak x prefill_attention_eff), the context's KV
  read once / bandwidth); a recomputed part's share goes to ``recompute``;
- ``sampling``: the fp32 logits written once and read three times (softmax, CDF, draw) on the device;
- ``overhead``: a fixed cost per step (launching a CUDA graph and the eager sampling kernels).

``limit`` is the physical floor of the same work: the bytes it truly needs (weights once, each KV
token a step reads once, a shared prefix once per request, no recompute) over the copy bandwidth, or
its FLOPs at peak, whichever is larger. The efficiency factors are this model's assumptions until a
GPU run of ``bench/`` writes measured ones (``DeviceParams.from_file``).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.jsonfile import loads_json
from engine.core.step_shape import ModelShape

_LOGIT_PASSES = 4  # write + softmax read + CDF read + draw read, fp32


@dataclass(slots=True, frozen=True)
class DeviceParams:
    """One accelerator, as the model sees it. Defaults: an H200 (SXM, 141 GB of HBM3e)."""

    name: str = "h200"
    memory_bytes: float = 150.7e9          # 143,771 MiB, as nvidia-smi reports an H200
    hbm_bytes_per_s: float = 4.0e12        # a measured device-to-device copy; the spec sheet says 4.8 TB/s
    peak_flops: float = 989e12             # dense bf16 tensor-core peak
    matmul_eff: float = 0.65               # attainable fraction of peak for the linear layers
    linear_bw_eff: float = 0.85            # weight streaming of small-batch GEMMs, of copy bandwidth
    attention_bw_eff: float = 0.75         # paged decode's KV read, of copy bandwidth
    prefill_attention_eff: float = 0.40    # FlashAttention-2-class prefill, of peak
    step_overhead_s: float = 1.5e-4        # graph launch + sampling kernels per step
    activation_reserve_bytes: float = 2e9  # activations, graphs and workspace kept out of the KV cache
    source: str = "assumed"                # "assumed" or the file the figures were read from

    def __post_init__(self):
        """Every figure a finite number in its range: a NaN, zero, negative or string one would make every
        modelled time nan, infinite or negative. ValueError names the figure and its range."""
        if not isinstance(self.name, str):
            raise ValueError(f"device parameter name must be a string, got {self.name!r}")
        for f in dataclasses.fields(self):
            if f.name in ("name", "source"):
                continue
            value, (low, high, closed) = getattr(self, f.name), _RANGES.get(f.name, (0.0, math.inf, False))
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and (low <= value if closed else low < value) and value <= high):
                span = f"{'[' if closed else '('}{low:g}, {high:g}{']' if high < math.inf else ')'}"
                raise ValueError(f"device parameter {f.name} must be a finite number in {span}, got {value!r}")
        if self.activation_reserve_bytes >= self.memory_bytes:
            raise ValueError(f"device parameter activation_reserve_bytes ({self.activation_reserve_bytes:g}) must be "
                             f"below memory_bytes ({self.memory_bytes:g})")

    @classmethod
    def from_file(cls, path: str | Path) -> "DeviceParams":
        """Read the figures a GPU run measured: the ``device_params.json`` that bench/gpu/kernels.py
        writes (copy bandwidth, matmul TFLOP/s, paged decode's fraction of the copy at >= 16k, prefill
        TFLOP/s), or a JSON of this class's fields (any subset). What is not given keeps its default;
        unknown keys of the second form are refused, naming the known ones; every ValueError names the file."""
        try:
            raw = loads_json(Path(path).read_bytes())  # over-nested input too: one ValueError
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: cannot be read as JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object of device parameters, got a {type(raw).__name__}")
        try:
            if "copy_bw_GBps" in raw:
                raw = cls._from_gpu_run(raw)
            known = {f.name for f in dataclasses.fields(cls)} - {"source"}
            unknown = sorted(set(raw) - known - {"measured", "commit", "command"})
            if unknown:
                raise ValueError(f"unknown device parameter(s) {unknown}; known: {sorted(known)}")
            base = preset_of(str(raw.get("name", "")))
            return dataclasses.replace(base, **{k: v for k, v in raw.items() if k in known}, source=str(path))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @classmethod
    def _from_gpu_run(cls, run: dict) -> dict:
        peak = preset_of(str(run.get("device") or "")).peak_flops
        out = {"name": str(run.get("device") or "gpu"), "hbm_bytes_per_s": _figure(run, "copy_bw_GBps") * 1e9}
        if run.get("matmul_tflops"):
            out["matmul_eff"] = min(1.0, _figure(run, "matmul_tflops") * 1e12 / peak)
        if run.get("paged_decode_bw_frac_min_16k"):
            out["attention_bw_eff"] = min(1.0, _figure(run, "paged_decode_bw_frac_min_16k"))
        prefill = run.get("prefill_tflops") or {}
        if not isinstance(prefill, dict):
            raise ValueError(f"prefill_tflops must be an object of TFLOP/s per case, got {prefill!r}")
        prefill = [_figure(prefill, k) for k, v in prefill.items() if v and not k.startswith("sdpa")]
        if prefill:
            out["prefill_attention_eff"] = min(1.0, max(prefill) * 1e12 / peak)
        return out

    @classmethod
    def named(cls, name: str) -> "DeviceParams":
        """A preset ('h100', 'h100-nvl', 'h200', 'b200': PRESETS) or a path to a JSON file of parameters."""
        if name in PRESETS:
            return PRESETS[name]
        if Path(name).is_file():
            return cls.from_file(name)
        raise ValueError(f"unknown device {name!r}: use one of {sorted(PRESETS)} or the path of a parameters JSON file "
                         "(bench/gpu/kernels.py writes one on a GPU)")


# figure -> (lowest, highest, lowest allowed); an efficiency is a fraction of a peak (or of the copy
# bandwidth, the floor's), in (0, 1]; any other figure is > 0
_RANGES = {name: (0.0, 1.0, False) for name in ("matmul_eff", "linear_bw_eff", "attention_bw_eff",
                                                "prefill_attention_eff")}
_RANGES |= {"step_overhead_s": (0.0, math.inf, True), "activation_reserve_bytes": (0.0, math.inf, True)}


# The presets. Memory: the total torch.cuda.mem_get_info() reports (what vLLM's gpu_memory_utilization is a
# fraction of). Bandwidth: the spec sheet's HBM figure times 4.0 / 4.8, the ratio of a measured device-to-device
# copy to the spec on an H200 (this model's bandwidth is the copy's). Peak: the spec sheet's dense BF16
# tensor-core figure. Sources (docs/rehearsal.md, "Device presets"): NVIDIA H100 datasheet (SXM5 80 GB: 3.35
# TB/s, 989 TFLOPS dense BF16; H100 NVL 94 GB: 3.9 TB/s, 1,671 TFLOPS BF16 with sparsity, 835 dense), H200 datasheet (141 GB, 4.8 TB/s, 989 TFLOPS), HGX B200 datasheet (180 GB,
# 8 TB/s, 2.25 PFLOPS dense BF16 per GPU). The efficiencies and the step overhead: HOPPER, assumed, the
# B200 carrying them over; HOPPER_FITTED, bench/rehearsal/calibration.py's fit to published Hopper measurements.
COPY_OF_SPEC = 4.0 / 4.8
HOPPER = dict(matmul_eff=0.65, linear_bw_eff=0.85, attention_bw_eff=0.75, prefill_attention_eff=0.40,
              step_overhead_s=1.5e-4)
HOPPER_SOURCE = "assumed"
# python -m bench.rehearsal.calibration's fit (linear_bw_eff and prefill_attention_eff kept): the '-fitted'
# presets. Not the defaults: fitted to the 15 published Hopper points whose workload is stated (21% rms
# residual, from 34%), paged decode at its bound and a 1.6 ms step overhead (which the 8B-only points fix only
# together with weight streaming); the misfit left follows the vLLM version measured, and the checks kept aside
# stay 79% off (docs/rehearsal.md, Calibration).
HOPPER_FITTED = dict(HOPPER, matmul_eff=0.3119, attention_bw_eff=1.0, step_overhead_s=1.585e-3)
FITTED_SOURCE = "fitted to 15 published H100/H200 measurements (residual 21%: docs/rehearsal.md, Calibration)"
PRESETS = {
    "h100": DeviceParams("h100", memory_bytes=81_559 * 2**20, hbm_bytes_per_s=3.35e12 * COPY_OF_SPEC,
                         peak_flops=989e12, **HOPPER, source=HOPPER_SOURCE),
    # the H100 NVL (PCIe, 94 GB HBM3; nvidia-smi lists 95,830 MiB): a "single H100 GPU (94GB)" of vLLM RFC #47351
    "h100-nvl": DeviceParams("h100-nvl", memory_bytes=95_830 * 2**20, hbm_bytes_per_s=3.9e12 * COPY_OF_SPEC,
                             peak_flops=835e12, **HOPPER, source=HOPPER_SOURCE),
    "h200": DeviceParams("h200", memory_bytes=143_771 * 2**20, hbm_bytes_per_s=4.8e12 * COPY_OF_SPEC,
                         peak_flops=989e12, **HOPPER, source=HOPPER_SOURCE),
    "b200": DeviceParams("b200", memory_bytes=183_359 * 2**20, hbm_bytes_per_s=8.0e12 * COPY_OF_SPEC,
                         peak_flops=2250e12, **HOPPER, source=f"{HOPPER_SOURCE} (Hopper's efficiencies, not fitted "
                                                                "to a B200 measurement)"),
}
PRESETS |= {f"{k}-fitted": dataclasses.replace(p, name=f"{k}-fitted", **HOPPER_FITTED, source=FITTED_SOURCE)
            for k, p in list(PRESETS.items()) if k != "b200"}


def preset_of(device_name: str) -> DeviceParams:
    """The preset whose name a GPU's name holds ('NVIDIA H100 80GB HBM3' -> h100, 'NVIDIA H100 NVL' -> h100-nvl),
    else the H200's: what a measured file's missing figures (peak, memory) default to."""
    name = device_name.lower().replace(" ", "-")
    return next((PRESETS[key] for key in sorted(PRESETS, key=len, reverse=True) if key in name), PRESETS["h200"])


def _figure(run: dict, key: str) -> float:
    value = run[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def attention_flops(shape: ModelShape, start: int, length: int) -> float:
    """QK^T and PV FLOPs of ``length`` causal queries at positions start.. (each sees itself and
    everything before it)."""
    return shape.attn_flops_per_pair * (length * start + length * (length + 1) / 2)


def kv_tokens(shape: ModelShape, device: DeviceParams, gpu_memory_utilization: float = 0.9) -> int:
    """Tokens of KV the default sizing gives on ``device``: what is left of its memory after the
    weights (the embedding table too, unless tied) and the activation reserve."""
    embedding = 0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size * shape.dtype_bytes
    room = device.memory_bytes * gpu_memory_utilization - shape.weight_bytes - embedding - device.activation_reserve_bytes
    return max(0, int(room // shape.kv_bytes_per_token))


@dataclass(slots=True)
class PrefillChunk:
    """``length`` prompt tokens at positions ``start..``; the first ``recompute`` of them were computed
    once before (a sequence preempted, or resumed, and recomputed)."""

    request_id: str
    start: int
    length: int
    recompute: int = 0


@dataclass(slots=True)
class DecodeGroup:
    """The decode rows of one request: each row's context (its new tokens included), the tokens of
    the prefix its rows hold in common, and the tokens the cascade kernel reads once for the group
    (0: each row reads its whole context). ``queries``: each row's query tokens (a verify row's last
    token and its drafts); None: one each."""

    request_id: str
    seq_lens: list[int]
    shared: int = 0
    cascade: int = 0
    queries: list[int] | None = None

    @property
    def num_queries(self) -> int:
        return len(self.seq_lens) if self.queries is None else sum(self.queries)

    def attention_flops(self, shape: ModelShape) -> float:
        """Its rows' QK^T and PV FLOPs: each query sees its row's context up to itself."""
        if self.queries is None:
            return shape.attn_flops_per_pair * sum(self.seq_lens)
        return sum(attention_flops(shape, n - q, q) for n, q in zip(self.seq_lens, self.queries))


@dataclass(slots=True)
class StepWork:
    """What one step computes, as the device model needs it."""

    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[DecodeGroup] = field(default_factory=list)
    sampled: int = 0  # rows that get logits and a draw

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.prefills) + sum(g.num_queries for g in self.decodes)


PARTS = ("weights", "matmul", "prefill", "recompute", "kv_read", "attention", "sampling", "overhead")


@dataclass(slots=True)
class StepCost:
    """Seconds, by part (see the module docstring); ``limit`` is the physical floor of the same work."""

    weights: float = 0.0
    matmul: float = 0.0
    prefill: float = 0.0
    recompute: float = 0.0
    kv_read: float = 0.0
    attention: float = 0.0
    sampling: float = 0.0
    overhead: float = 0.0
    limit: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, p) for p in PARTS)

    def add(self, other: "StepCost", share: float = 1.0) -> None:
        for p in (*PARTS, "limit"):
            setattr(self, p, getattr(self, p) + share * getattr(other, p))

    def to_dict(self) -> dict:
        return {p: getattr(self, p) for p in (*PARTS, "limit")} | {"total": self.total}


def step_cost(work: StepWork, shape: ModelShape, dev: DeviceParams,
              key: Callable[[str], object] = str) -> tuple[StepCost, dict[object, StepCost]]:
    """The modelled cost of one step, and the share of it of each ``key(request_id)`` (by default
    each request; a rehearsal of PaCoRe passes the request's round).

    Shares: the weights, the overhead and the sampling by token (a share's tokens in the step over
    the step's), the rest by the work its own requests ask for.
    """
    bw, peak = dev.hbm_bytes_per_s, dev.peak_flops
    kvpt = shape.kv_bytes_per_token
    tokens = work.num_tokens
    if tokens == 0:
        return StepCost(), {}
    weights = shape.weight_bytes / (bw * dev.linear_bw_eff)
    mm_flops = 2.0 * shape.linear_params * tokens + 2.0 * shape.lm_head_params * work.sampled
    excess = max(0.0, mm_flops / (peak * dev.matmul_eff) - weights) / tokens  # per token
    kv_s = kvpt / (bw * dev.attention_bw_eff)  # per token of KV read or stored
    needed_bytes, needed_flops = float(shape.weight_bytes), 2.0 * shape.linear_params * tokens
    # per key: [decode tokens, new prefill tokens, recomputed tokens, kv_read, attention, recompute attention]
    acc: dict[object, list[float]] = {}
    for g in work.decodes:
        a = acc.setdefault(key(g.request_id), [0.0] * 6)
        n, total, q = len(g.seq_lens), sum(g.seq_lens), g.num_queries
        flops = g.attention_flops(shape)
        a[0] += q
        # reads (a cascade prefix once), plus the stores; each row's KV read once for all its queries
        a[3] += max((total - (n - 1) * g.cascade + q) * kv_s, flops / (peak * dev.prefill_attention_eff))
        needed_bytes += (total - (n - 1) * g.shared + q) * kvpt
        needed_flops += flops
    for ch in work.prefills:
        a = acc.setdefault(key(ch.request_id), [0.0] * 6)
        redo = min(ch.recompute, ch.length)
        a[1] += ch.length - redo
        a[2] += redo
        flops = attention_flops(shape, ch.start, ch.length)
        flops_redo = attention_flops(shape, ch.start, redo)
        t = max(flops / (peak * dev.prefill_attention_eff), (ch.start + 2 * ch.length) * kv_s)  # context + stores
        frac = flops_redo / flops if flops else 0.0
        a[4] += t * (1 - frac)
        a[5] += t * frac
        needed_bytes += (ch.start + 2 * ch.length) * kvpt
        needed_flops += flops - flops_redo - 2.0 * shape.linear_params * redo
    needed_bytes += work.sampled * shape.vocab_size * 4
    needed_flops += 2.0 * shape.lm_head_params * work.sampled
    limit = max(needed_bytes / bw, needed_flops / peak)
    logits = work.sampled * shape.vocab_size * 4 * _LOGIT_PASSES / bw
    def cost_of(dec, new, redo, kv, attn, attn_redo) -> StepCost:
        share = (dec + new + redo) / tokens
        return StepCost(weights=weights * share, matmul=dec * excess, prefill=new * excess,
                        recompute=redo * excess + attn_redo, kv_read=kv, attention=attn,
                        sampling=logits * share, overhead=dev.step_overhead_s * share)
    cost = cost_of(*map(sum, zip(*acc.values())))
    cost.limit = limit
    per = {k: cost_of(*a) for k, a in acc.items()}
    for c in per.values():  # the floor shared out like the time
        c.limit = limit * c.total / cost.total
    return cost, per


def bounds_tokens(shape: ModelShape) -> float:
    """One block's key bounds (a min and a max key vector per layer, in the model's dtype) as the tokens of KV
    of the same bytes: what scoring a block costs against reading a token's keys and values."""
    return shape.dtype_bytes / (shape.kv_dtype_bytes or shape.dtype_bytes)


@dataclass(slots=True, frozen=True)
class DraftRead:
    """What one self-drafting draft step reads (speculative_config method "self_window", engine/spec/config.py):
    per row its sink and window of KV (the window max(window, window_fraction x context)); with ``selected`` > 0
    the sink, window and selected tokens in whole blocks of ``block_size``, and with selection "bounds" the key
    bounds of every block between sink and window, which scoring them reads ("verify": ranked by the last
    verify pass, nothing more to read); all of it over the layers ``layers`` keeps (speculative_config
    ``draft_layers``: None every layer, a count, or the layers' indices; engine/spec/layer_skip.py), the LM head
    always."""

    window: int
    sink: int
    window_fraction: float = 0.0
    selected: int = 0
    selection: str = "bounds"
    layers: int | tuple[int, ...] | None = None
    block_size: int = 16

    @classmethod
    def of(cls, spec, block_size: int = 16) -> "DraftRead":
        """A speculative config's draft read."""
        return cls(spec.window, spec.sink, spec.window_fraction, spec.selected, spec.selection, spec.draft_layers,
                   block_size)

    @property
    def bounds(self) -> bool:
        """Whether the cache keeps, and each draft step reads, key bounds per block."""
        return self.selected > 0 and self.selection == "bounds"

    def shape(self, shape: ModelShape) -> ModelShape:
        """The model one draft step runs: the layers ``layers`` keeps (their projections, norms and KV), the LM
        head and final norm whole. ValueError naming draft_layers when it asks for more than the model has."""
        from engine.spec.layer_skip import kept_layers

        kept = kept_layers(self.layers, shape.num_layers)
        return shape if kept is None else dataclasses.replace(shape, num_layers=len(kept))

    def tokens(self, n: int, shape: ModelShape) -> int:
        """KV tokens per drafted layer one draft step of a row of ``n`` tokens reads (key bounds counted as the
        tokens of the same bytes: ``bounds_tokens``)."""
        if not self.selected:
            return min(n, self.sink + max(self.window, int(self.window_fraction * n)))
        bs = self.block_size
        sink_b, top_b, recent_b = -(-self.sink // bs), -(-self.selected // bs), max(1, -(-self.window // bs))
        read = min(n, (sink_b + top_b + recent_b) * bs)
        if self.bounds:  # every block between sink and window is scored
            read += round(max(0, -(-n // bs) - sink_b - recent_b) * bounds_tokens(shape))
        return read


def speculation_seconds(shape: ModelShape, dev: DeviceParams, draft: DraftRead):
    """The self-drafting depth policy's costs (engine/spec/policy.py) from this model: for a batch's
    context lengths and a depth n, (a draft step: what ``draft`` reads, the drafted layers' weights and the LM
    head, per row its KV and key bounds; the verify pass: every row's KV once for its n + 1 queries, all
    layers); n = 0: (0, a plain decode step)."""
    draft_shape = draft.shape(shape)

    def seconds(ctx: list[int], n: int) -> tuple[float, float]:
        rows = len(ctx)
        if n == 0:
            return 0.0, step_cost(StepWork(decodes=[DecodeGroup("", ctx)], sampled=rows), shape, dev)[0].total
        seen = [draft.tokens(c, shape) for c in ctx]
        step = step_cost(StepWork(decodes=[DecodeGroup("", seen)], sampled=rows), draft_shape, dev)[0].total
        verify = step_cost(StepWork(decodes=[DecodeGroup("", [c + n for c in ctx], queries=[n + 1] * rows)],
                                    sampled=rows * (n + 1)), shape, dev)[0].total
        return step, verify
    return seconds
