"""The device model against published measurements: rehearse each, fit the efficiencies, print the table.

    python -m bench.rehearsal.calibration            # every point at its published size (minutes of CPU)
    python -m bench.rehearsal.calibration --quick    # each point scaled down (seconds): the machinery only

Each POINT is a public measurement of vLLM on a GPU, restated as a plain workload (bench/rehearsal/plain.py)
with what its source says (model, GPU, lengths, prompts, engine limits) and, where the source does not say,
an assumption written beside it. How much is assumed decides whether a point is fitted (``Point.stated``): the
fit takes the points whose workload is stated ("full") or whose assumption its figure barely depends on
("partial"); a point whose figure rests on an assumption ("assumed") is a check, as is one on a GPU the fit
does not cover. Each is rehearsed once; its schedule does not depend on the device's
speed (every request arrives at once, or as others finish), so the fit prices the same steps again under
other figures (``Features``, vectorised: the sum engine/device_model.py's step_cost makes, term by term) and
moves the Hopper efficiencies (FIT) to minimise the squared log-ratio of rehearsed to published. It prints
published vs rehearsed at the presets' figures and at the fitted ones, the ratio, and the residual (the
root-mean-square of the log-ratios, as a percentage). docs/rehearsal.md ("Calibration") has the table.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.device_model import PRESETS, DeviceParams

from bench.rehearsal import plain
from bench.rehearsal.checks import MAX_KV_TOKENS
from bench.rehearsal.shapes import model_folder

# linear_bw_eff is held at the assumed figure: every point is an 8B model, so weight streaming and the step
# overhead are both a constant per step and the points fix only their sum (fitted together, the search crawled
# along that valley and weight streaming ran to its bound).
FIT = ("attention_bw_eff", "matmul_eff", "step_overhead_s")
BOUNDS = {"linear_bw_eff": (0.3, 1.0), "attention_bw_eff": (0.2, 1.0), "matmul_eff": (0.2, 1.0),
          "step_overhead_s": (1e-6, 3e-3), "prefill_attention_eff": (0.1, 1.0)}


@dataclass(slots=True)
class Point:
    """A published measurement, and the plain workload that restates it (``flags``: plain.py's flags;
    ``quick``: the same at a size a test runs in seconds)."""

    name: str
    regime: str
    source: str
    hardware: str
    workload: str
    published: float
    metric: str  # a key of plain.figures
    shape: str
    device: str
    flags: dict
    quick: dict = field(default_factory=dict)
    fit: bool = True  # False: kept aside, a check of the fit rather than a point of it
    # "full": every length, count and engine limit published (or the benchmark tool's documented default);
    # "partial": something assumed that the figure depends on only weakly (input lengths under a decode-bound
    # throughput, output lengths under a per-token latency); "assumed": the figure rests on an assumption
    stated: str = "full"
    vllm: str = "current"  # the vLLM the source ran: "current" (V1), else its version (V0's host work per step)


# Figures where less is faster: the table's ratio is always the modelled speed over the published one.
LOWER_IS_BETTER = {"duration_s", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms"}


_ML_ENERGY = ("The ML.ENERGY Leaderboard (ml-energy/leaderboard, public/data/models/Qwen__Qwen3-8B__lm-arena-chat.json): "
              "Qwen3-8B bf16 on vLLM, LM Arena chat prompts, mean output ~650 tokens, at max_num_seqs {seqs}: "
              "{tps} output tokens/s (median ITL {itl} ms)")
_CHAT = ("1,024 prompts (the data's output-length histogram counts 1,024 requests per configuration) of 512 tokens, "
         "650 out, both uniform within 90% (vllm bench's --random-range-ratio 0.9; ASSUMED: the input lengths are not "
         "published, the output lengths' mean is), max_num_seqs {seqs}, max_num_batched_tokens 8192 (ASSUMED: vLLM's "
         "serving default)")


def _chat(seqs: int, out: int = 650) -> dict:
    return dict(random_input_len=512, random_output_len=out, random_range_ratio=0.9, num_prompts=1024,
                max_num_seqs=seqs, max_num_batched_tokens=8192)


_ML_ENERGY_LLAMA = ("The ML.ENERGY Leaderboard (ml-energy/leaderboard, public/data/models/"
                    "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json): Llama-3.1-8B-Instruct bf16 on vLLM, LM "
                    "Arena chat prompts, mean output ~400 tokens, at max_num_seqs {seqs}: {tps} output tokens/s "
                    "(median ITL {itl} ms)")
_CHAT_LLAMA = _CHAT.replace("650 out", "400 out")
_ML_ENERGY_GPQA = ("The ML.ENERGY Leaderboard (ml-energy/leaderboard, public/data/models/Qwen__Qwen3-8B__gpqa.json): "
                   "Qwen3-8B bf16 on vLLM, GPQA prompts (198 requests), mean output {out} tokens (812 to 32,768), at "
                   "max_num_seqs {seqs}: {tps} output tokens/s (median ITL {itl} ms)")
_GPQA = ("198 prompts (the data's mean output is a count over 198 requests) of 256 tokens (ASSUMED: the input lengths "
         "are not published), {out} out, both uniform within 90% (ASSUMED: the published output lengths spread from "
         "812 to 32,768 around that mean), max_num_seqs {seqs}, max_num_batched_tokens 8192 (ASSUMED: vLLM's serving "
         "default)")


def _gpqa(seqs: int, out: int) -> dict:
    return dict(random_input_len=256, random_output_len=out, random_range_ratio=0.9, num_prompts=198,
                max_num_seqs=seqs, max_num_batched_tokens=8192)


_VLLM_CI = ("vLLM's performance benchmark on Buildkite (buildkite.com/vllm/performance-benchmark/builds/{build}), "
            "latency_llama8B_tp1: benchmark_latency.py on llama-3.1 8B (.buildkite/nightly-benchmarks/tests/"
            "latency-tests.json: dummy weights, 5 warm-up and 15 timed iterations), batch 8, 32 tokens in, 128 out, "
            "on {gpu}: mean latency {ms} ms (the build's date and vLLM commit are not on the stored page)")
_LATENCY = ("8 prompts of 32 tokens, 128 out each, all at once (benchmark_latency's fixed batch: the suite's stated "
            "lengths), vLLM's limits for the rest (max_num_seqs 256, max_num_batched_tokens 8192; the 256 prompt "
            "tokens fit one step either way); the figure is the batch's end-to-end seconds")
_LMDEPLOY = ("InternLM/lmdeploy issue #1608 (2024-05-17): vLLM 0.4.2 on one H800 (TP 1), Meta-Llama-3-8B-Instruct "
             "(max_position_embeddings raised to 409,600), a prompt of {prompt} tokens: TPOT {tpot} ms (ASSUMED: one "
             "prompt at a time, as the issue's lmdeploy script; its vLLM script is not in the stored copy)")
_SINGLE = ("one prompt of {prompt} tokens at a time, 256 out (ASSUMED: the output length is not in the stored "
           "issue; TPOT averages the decode steps, which it barely moves), the H800 as the h100 preset (ASSUMED: the "
           "same HBM3 bandwidth and dense BF16 peak; it differs in NVLink and FP64), vLLM 0.4.2's max_num_seqs 256; "
           "prefill in chunks of 8192 (0.4.2 prefilled whole, which TPOT does not see)")


def _latency() -> dict:
    return dict(random_input_len=32, random_output_len=128, num_prompts=8, max_num_seqs=256,
                max_num_batched_tokens=8192)


def _single(prompt: int) -> dict:
    return dict(random_input_len=prompt, random_output_len=256, num_prompts=1, max_concurrency=1, max_num_seqs=256,
                max_num_batched_tokens=8192)


POINTS = [
    Point("qwen3-8b chat x8", "small-batch decode (weight-bound)",
          _ML_ENERGY.format(seqs=8, tps="961.7", itl="8.20"), "1x H100", _CHAT.format(seqs=8),
          961.7, "output_tokens_per_s", "qwen3-8b", "h100", _chat(8),
          dict(num_prompts=8, random_output_len=64), stated="partial"),
    Point("qwen3-8b chat x64", "batched chat",
          _ML_ENERGY.format(seqs=64, tps="4,314.7", itl="13.95"), "1x H100", _CHAT.format(seqs=64),
          4314.7, "output_tokens_per_s", "qwen3-8b", "h100", _chat(64),
          dict(num_prompts=16, max_num_seqs=8, random_output_len=64), stated="partial"),
    Point("qwen3-8b chat x128", "batched chat",
          _ML_ENERGY.format(seqs=128, tps="5,930.3", itl="20.70"), "1x H100", _CHAT.format(seqs=128),
          5930.3, "output_tokens_per_s", "qwen3-8b", "h100", _chat(128),
          dict(num_prompts=16, max_num_seqs=8, random_output_len=64), stated="partial"),
    Point("qwen3-8b chat x256", "batched chat",
          _ML_ENERGY.format(seqs=256, tps="7,718.8", itl="31.36"), "1x H100", _CHAT.format(seqs=256),
          7718.8, "output_tokens_per_s", "qwen3-8b", "h100", _chat(256),
          dict(num_prompts=32, max_num_seqs=16, random_output_len=64), stated="partial"),

    Point("llama3-8b 256/256", "batched short requests",
          "vLLM PR #7117 (youkaichao, 2024-08): benchmarks/benchmark_throughput.py --input-len 256 --output-len "
          "256 --model meta-llama/Meta-Llama-3-8B, 12,453 tokens/s (24.32 requests/s), main branch, 3 trials",
          "1x H100", "1,000 prompts of 256 tokens, 256 out each (the script's defaults: 1,000 prompts, vLLM 0.5 "
          "V0: max_num_seqs 256, no chunked prefill)", 12_453.0, "total_tokens_per_s", "llama3-8b", "h100",
          dict(random_input_len=256, random_output_len=256, num_prompts=1000, max_num_seqs=256,
               max_num_batched_tokens=8192), dict(num_prompts=16, max_num_seqs=16, random_output_len=16),
          vllm="0.5"),
    Point("llama3-8b 1000/100", "prefill-heavy requests",
          "vLLM PR #4600 (simon-mo, 2024-05, v0.4.1 column): benchmark_throughput.py --input-len 1000 --output-len "
          "100 --model meta-llama/Meta-Llama-3-8B-Instruct, 20.72 requests/s", "1x H100",
          "1,000 prompts of 1,000 tokens, 100 out each (vLLM 0.4.1 V0: max_num_seqs 256, no chunked prefill)",
          20.72, "requests_per_s", "llama3-8b", "h100",
          dict(random_input_len=1000, random_output_len=100, num_prompts=1000, max_num_seqs=256,
               max_num_batched_tokens=8192), dict(num_prompts=16, max_num_seqs=16, random_output_len=16), vllm="0.4.1"),
    Point("qwen3-8b AIME x32", "KV-bound long decode (cache full)",
          "vLLM RFC #47351 (sparse-attention self-speculation): Qwen3-8B on AIME 2025 prompts, 32 samples each, "
          "~1,000 tokens/s without speculation", "1x H100",
          "8 prompts of 200 tokens x n=32, 8,192 tokens out each (ASSUMED: the RFC's output lengths are not "
          "restated here; 8 of the 30 prompts already fill the cache), vLLM V1 defaults for a >= 70 GiB GPU "
          "(ASSUMED: max_num_seqs 1024, max_num_batched_tokens 16384)", 1000.0, "output_tokens_per_s", "qwen3-8b",
          "h100", dict(random_input_len=200, random_output_len=8192, num_prompts=8, n=32, max_num_seqs=1024,
                       max_num_batched_tokens=16384),
          dict(random_output_len=128, num_prompts=2, n=4, max_model_len=512), fit=False, stated="assumed"),
    Point("qwen3-8b AIME x32 + self-draft 4", "self-speculation",
          "vLLM RFC #47351: the same with a sink + window drafter of 4 tokens, ~1,600 tokens/s", "1x H100",
          "as above, self-drafting up to 4 tokens over a sink of 16 and a window of 512 (ASSUMED), each draft "
          "token accepted with probability 0.8 (ASSUMED)", 1600.0, "output_tokens_per_s", "qwen3-8b", "h100",
          dict(random_input_len=200, random_output_len=8192, num_prompts=8, n=32, max_num_seqs=1024,
               max_num_batched_tokens=16384, self_draft=4, spec_acceptance=0.8),
          dict(random_output_len=128, num_prompts=2, n=4, max_model_len=512), fit=False, stated="assumed"),
    Point("llama3.1-8b chat x16", "small-batch decode (weight-bound)",
          _ML_ENERGY_LLAMA.format(seqs=16, tps="1,953.6", itl="7.91"), "1x H100", _CHAT_LLAMA.format(seqs=16),
          1953.6, "output_tokens_per_s", "llama3-8b", "h100", _chat(16, 400),
          dict(num_prompts=16, max_num_seqs=8, random_output_len=64), stated="partial"),
    Point("llama3.1-8b chat x32", "batched chat",
          _ML_ENERGY_LLAMA.format(seqs=32, tps="3,391.1", itl="8.91"), "1x H100", _CHAT_LLAMA.format(seqs=32),
          3391.1, "output_tokens_per_s", "llama3-8b", "h100", _chat(32, 400),
          dict(num_prompts=16, max_num_seqs=8, random_output_len=64), stated="partial"),
    Point("qwen3-8b GPQA x16", "long decode (reasoning, ~8k tokens out)",
          _ML_ENERGY_GPQA.format(seqs=16, out="7,861", tps="1,344.8", itl="11.91"), "1x H100",
          _GPQA.format(out="7,861", seqs=16), 1344.8, "output_tokens_per_s", "qwen3-8b", "h100", _gpqa(16, 7861),
          dict(num_prompts=4, max_num_seqs=4, random_output_len=64), stated="partial"),
    Point("qwen3-8b GPQA x64", "long decode (reasoning, ~8k tokens out)",
          _ML_ENERGY_GPQA.format(seqs=64, out="8,367", tps="2,510.2", itl="26.64"), "1x H100",
          _GPQA.format(out="8,367", seqs=64), 2510.2, "output_tokens_per_s", "qwen3-8b", "h100", _gpqa(64, 8367),
          dict(num_prompts=4, max_num_seqs=4, random_output_len=64), stated="partial"),
    Point("qwen3-8b GPQA x96", "KV-bound long decode (cache full)",
          _ML_ENERGY_GPQA.format(seqs=96, out="8,052", tps="3,117.4", itl="27.88") + " (mean batch 82.0: the cache "
          "holds fewer than 96)", "1x H100", _GPQA.format(out="8,052", seqs=96), 3117.4, "output_tokens_per_s",
          "qwen3-8b", "h100", _gpqa(96, 8052), dict(num_prompts=4, max_num_seqs=4, random_output_len=64),
          stated="partial"),
    Point("llama3.1-8b latency x8 (H100)", "small-batch decode, stated in full",
          _VLLM_CI.format(build=9555, gpu="8xH100 (one GPU at TP 1)", ms="997.5"), "1x H100", _LATENCY,
          0.9975, "duration_s", "llama3-8b", "h100", _latency(), dict(random_output_len=16), vllm="V0 (ASSUMED: a 2024 CI build)"),
    Point("llama3.1-8b latency x8 (H200)", "small-batch decode, stated in full",
          _VLLM_CI.format(build=9515, gpu="H200", ms="833.4") + " (build #9513: 834.1 ms)", "1x H200", _LATENCY,
          0.8334, "duration_s", "llama3-8b", "h200", _latency(), dict(random_output_len=16), vllm="V0 (ASSUMED: a 2024 CI build)"),
    Point("llama3-8b batch 1, 1k context", "single-request decode (weight-bound)",
          _LMDEPLOY.format(prompt="1k", tpot="8.66"), "1x H800", _SINGLE.format(prompt="1,024 (ASSUMED: \"1k\")"),
          8.66, "mean_tpot_ms", "llama3-8b", "h100", _single(1024), dict(random_input_len=64, random_output_len=16),
          stated="partial", vllm="0.4.2"),
    Point("llama3-8b batch 1, 200k context", "single-request decode, 200k context (KV-bound)",
          _LMDEPLOY.format(prompt="200k", tpot="30"), "1x H800", _SINGLE.format(prompt="204,790 (200 x 1,024 - 10)"),
          30.0, "mean_tpot_ms", "llama3-8b", "h100", _single(204_790),
          dict(random_input_len=2048, random_output_len=8), stated="partial", vllm="0.4.2"),
    Point("qwen3-8b chat x128 (B200)", "batched chat, another GPU (kept aside)",
          _ML_ENERGY.format(seqs=128, tps="9,118.9", itl="12.08"), "1x B200", _CHAT.format(seqs=128),
          9118.9, "output_tokens_per_s", "qwen3-8b", "b200", _chat(128),
          dict(num_prompts=16, max_num_seqs=8, random_output_len=64), fit=False, stated="partial"),
]


def flags_of(point: Point, quick: bool, out: Path) -> argparse.Namespace:
    """plain.py's flags for a point (the rest at the rehearsal's defaults)."""
    flags = dict(device=point.device, shape=point.shape, n=1, max_concurrency=None, gpu_memory_utilization=0.9,
                 random_range_ratio=0.0,
                 max_model_len=None, max_kv_tokens=MAX_KV_TOKENS, self_draft=None, spec_acceptance=None, seed=0,
                 out=str(out)) | point.flags | (point.quick if quick else {})
    return argparse.Namespace(**flags)


@dataclass(slots=True)
class Features:
    """A trace's works as arrays, to price them under any device figures at once (plain.Trace)."""

    tokens: np.ndarray
    sampled: np.ndarray
    group_work: np.ndarray   # per decode group: its work, KV tokens read and stored, attention FLOPs
    group_kv: np.ndarray
    group_flops: np.ndarray
    chunk_work: np.ndarray   # per prefill chunk: its work, attention FLOPs, KV tokens read and stored
    chunk_flops: np.ndarray
    chunk_kv: np.ndarray
    step_of_work: np.ndarray
    steps: int

    @classmethod
    def of(cls, trace: plain.Trace, shape) -> "Features":
        from engine.device_model import attention_flops
        g = ([], [], [])
        c = ([], [], [])
        for i, w in enumerate(trace.works):
            for d in w.decodes:
                n = len(d.seq_lens)
                g[0].append(i)
                g[1].append(sum(d.seq_lens) - (n - 1) * d.cascade + d.num_queries)
                g[2].append(d.attention_flops(shape))
            for ch in w.prefills:
                c[0].append(i)
                c[1].append(attention_flops(shape, ch.start, ch.length))
                c[2].append(ch.start + 2 * ch.length)
        step_of = np.zeros(len(trace.works), dtype=np.int64)
        at = 0
        for s, b in enumerate(trace.bounds):
            step_of[at:b] = s
            at = b
        arr = lambda xs, t=float: np.asarray(xs, dtype=t)  # noqa: E731
        return cls(arr([w.num_tokens for w in trace.works]), arr([w.sampled for w in trace.works]),
                   arr(g[0], np.int64), arr(g[1]), arr(g[2]), arr(c[0], np.int64), arr(c[1]), arr(c[2]), step_of,
                   len(trace.bounds))

    def step_seconds(self, shape, dev: DeviceParams) -> np.ndarray:
        """Each engine step's modelled seconds: step_cost's total of each of its works, summed."""
        bw, peak = dev.hbm_bytes_per_s, dev.peak_flops
        weights = shape.weight_bytes / (bw * dev.linear_bw_eff)
        mm = (2.0 * shape.linear_params * self.tokens + 2.0 * shape.lm_head_params * self.sampled) / (peak * dev.matmul_eff)
        kv_s = shape.kv_bytes_per_token / (bw * dev.attention_bw_eff)
        attn = peak * dev.prefill_attention_eff
        t = np.maximum(weights, mm) + self.sampled * shape.vocab_size * 16 / bw + dev.step_overhead_s
        t += np.bincount(self.group_work, np.maximum(self.group_kv * kv_s, self.group_flops / attn), len(t))
        t += np.bincount(self.chunk_work, np.maximum(self.chunk_flops / attn, self.chunk_kv * kv_s), len(t))
        t[self.tokens == 0] = 0.0
        return np.bincount(self.step_of_work, t, self.steps)


def rehearse_points(points: list[Point], quick: bool, out: Path) -> list[tuple[Point, plain.Trace, object]]:
    """Each point rehearsed once: (point, its trace, its model shape)."""
    done = []
    for pt in points:
        print(f"rehearsing {pt.name} ...", file=sys.stderr)
        args = flags_of(pt, quick, out)
        f = plain.run(args, model_folder(pt.shape, out / "model"), DeviceParams.named(pt.device))
        done.append((pt, f["trace"], f["shape"]))
    return done


def evaluate(runs, devices: dict[str, DeviceParams]) -> list[float]:
    """Each point's rehearsed figure under ``devices`` (by the point's device name)."""
    out = []
    for pt, trace, shape, feats in runs:
        secs = feats.step_seconds(shape, devices[pt.device])
        out.append(plain.figures(trace, shape, devices[pt.device], list(secs))[pt.metric])
    return out


def residual(runs, values: list[float], keep=lambda pt: pt.fit) -> float:
    """The root-mean-square of log(rehearsed / published) over the points ``keep`` selects (by default the
    fitted ones), as a fraction (0.1: ~10%); nan when there are none."""
    logs = [math.log(v / pt.published) for (pt, *_), v in zip(runs, values) if keep(pt)]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else math.nan


def fit(runs, start: DeviceParams, names=FIT) -> tuple[DeviceParams, float]:
    """The figures ``names`` that minimise the residual, the rest as ``start`` has them; with the residual
    they leave. A coordinate search in log space within BOUNDS: each figure in turn times e^+-step while that
    helps, the step halved when none does (deterministic; every evaluation re-prices the traces at once)."""
    def devices(x) -> dict[str, DeviceParams]:
        changes = dict(zip(names, x))
        return {k: dataclasses.replace(p, **changes) for k, p in PRESETS.items()} | {
            start.name: dataclasses.replace(start, **changes)}

    def loss(x) -> float:
        return residual(runs, evaluate(runs, devices(x)))

    x = [min(BOUNDS[n][1], max(BOUNDS[n][0], getattr(start, n))) for n in names]
    best, step = loss(x), 0.5
    while step > 1e-3:
        moved = False
        for i, n in enumerate(names):
            for sign in (1, -1):
                y = list(x)
                y[i] = min(BOUNDS[n][1], max(BOUNDS[n][0], x[i] * math.exp(sign * step)))
                value = loss(y)
                if value < best - 1e-12:
                    x, best, moved = y, value, True
        if not moved:
            step /= 2
    return devices(x)[start.name], best


def speed_ratio(pt: Point, value: float) -> float:
    """The modelled speed over the published one (> 1: the model is faster than the measurement)."""
    return pt.published / value if pt.metric in LOWER_IS_BETTER else value / pt.published


def _num(x: float) -> str:
    return f"{x:,.4g}" if x < 100 else f"{x:,.0f}" if x >= 10_000 else f"{x:,.1f}"


def table(runs, before: list[float], after: list[float]) -> str:
    head = ("| point | regime | hardware | published | rehearsed (presets) | speed ratio | rehearsed (fitted) | "
            "speed ratio | workload stated | in fit |")
    lines = [head, "|" + "---|" * 10]
    for (pt, *_), b, a in zip(runs, before, after):
        lines.append(f"| {pt.name} | {pt.regime} | {pt.hardware} | {_num(pt.published)} {pt.metric} | {_num(b)} | "
                     f"{speed_ratio(pt, b):.2f} | {_num(a)} | {speed_ratio(pt, a):.2f} | {pt.stated} | "
                     f"{'yes' if pt.fit else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal.calibration", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="each point scaled down: the machinery in seconds, no "
                   "meaningful figure")
    p.add_argument("--out", default="runs/calibration")
    args = p.parse_args(argv)
    out = Path(args.out)
    runs = [(pt, trace, shape, Features.of(trace, shape)) for pt, trace, shape in rehearse_points(POINTS, args.quick, out)]
    before = evaluate(runs, dict(PRESETS))
    h100, res = fit(runs, PRESETS["h100"])
    after = evaluate(runs, {k: dataclasses.replace(v, **{n: getattr(h100, n) for n in FIT}) for k, v in PRESETS.items()})
    print(table(runs, before, after))
    n_fit = sum(pt.fit for pt, *_ in runs)
    aside = lambda pt: not pt.fit  # noqa: E731
    print(f"\nresidual (rms of log rehearsed/published) over the {n_fit} points fitted: presets "
          f"{100 * residual(runs, before):.1f}%, fitted {100 * res:.1f}%; over the {len(runs) - n_fit} kept aside: "
          f"presets {100 * residual(runs, before, aside):.1f}%, fitted {100 * residual(runs, after, aside):.1f}%")
    by = {k: [math.log(v / pt.published) ** 2 for (pt, *_), v in zip(runs, after) if pt.stated == k]
          for k in ("full", "partial", "assumed")}
    print("fitted figures, by how the workload is stated: " + "; ".join(
        f"{k} ({len(v)}) {100 * math.sqrt(sum(v) / len(v)):.1f}%" for k, v in by.items() if v))
    print("fitted: " + ", ".join(f"{n}={getattr(h100, n):.4g}" for n in FIT))
    # The same fit over the fitted points measured on a current vLLM only: how much of the residual is the
    # older engines' host work per step rather than the GPU.
    current = [r for r in runs if r[0].fit and r[0].vllm == "current"]
    if current:
        cur, res_cur = fit(current, PRESETS["h100"])
        after_cur = evaluate(runs, {k: dataclasses.replace(v, **{n: getattr(cur, n) for n in FIT})
                                    for k, v in PRESETS.items()})
        older = lambda pt: pt.fit and pt.vllm != "current"  # noqa: E731
        print(f"fit over the {len(current)} fitted points on a current vLLM only: residual {100 * res_cur:.1f}%; "
              f"with its figures, the older-vLLM fitted points {100 * residual(runs, after_cur, older):.1f}%, the "
              f"checks {100 * residual(runs, after_cur, aside):.1f}%; figures: "
              + ", ".join(f"{n}={getattr(cur, n):.4g}" for n in FIT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
