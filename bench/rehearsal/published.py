"""The published measurements the device model is calibrated against (bench/rehearsal/calibration.py).

Each ``Point`` is a public measurement of vLLM on a GPU, as its source states it, and the plain workload
(bench/rehearsal/plain.py's flags) that restates it; what the source does not state is written beside it as
ASSUMED, and ``stated`` says how much the figure rests on such assumptions (which decides whether the fit
takes the point or keeps it as a check). docs/rehearsal.md ("Calibration") lists them with their sources.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
    config: str = ""  # a bench/rehearsal configuration (CONFIGS) whose engine options it runs with ("": the defaults)


# Figures where less is faster: the table's ratio is always the modelled speed over the published one.
LOWER_IS_BETTER = {"duration_s", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms"}


_ML_ENERGY = ("The ML.ENERGY Leaderboard (ml-energy/leaderboard, public/data/models/Qwen__Qwen3-8B__lm-arena-chat.json): "
              "Qwen3-8B bf16 on vLLM, LM Arena chat prompts, mean output ~650 tokens, at max_num_seqs {seqs}: "
              "{tps} output tokens/s (median ITL {itl} ms)")
_CHAT = ("1,024 prompts (the data's output-length histogram counts 1,024 requests per configuration) of 512 tokens, "
         "650 out, both uniform within 90% (vllm bench's --random-range-ratio 0.9; ASSUMED: the input lengths are not "
         "published, the output lengths' mean is), max_num_seqs {seqs}, max_num_batched_tokens 8192 (ASSUMED: vLLM's "
         "serving default)")


def _ml_energy(seqs: int, prompts: int, input_len: int, out: int) -> dict:
    """An ML.ENERGY configuration: its requests, lengths within 90% of the stated means, vLLM's serving budget."""
    return dict(random_input_len=input_len, random_output_len=out, random_range_ratio=0.9, num_prompts=prompts,
                max_num_seqs=seqs, max_num_batched_tokens=8192)


def _chat(seqs: int, out: int = 650) -> dict:
    return _ml_energy(seqs, 1024, 512, out)


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
    return _ml_energy(seqs, 198, 256, out)


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


_RFC = ("vLLM RFC #47351 (sparse-attention self-speculation, open; its code in the public fork platformxlab/vegas, "
        "benchmarks/benchmark_vegas.py): Qwen3-8B, the 30 AIME 2025 problems x 32 = 960 requests, max_num_seqs 128, "
        "max_tokens = max_model_len 40,960, temperature 0.6, top_p 0.95, top_k 20, vLLM's LLM class, one GPU: {figure}")
_RFC_PLAIN = "~1,000 output tokens/s without speculation (the RFC's text, 'one H100')"
_RFC_SELF = "~1,600 output tokens/s with the StreamingLLM drafter, 4 drafts (the RFC's text)"
_POSTER_PLAIN = ("940 output tokens/s without speculation (the Vegas poster, on a 'single H100 GPU (94GB)': an H100 "
                 "NVL; Vegas's own drafter, 6 drafts: 1,893)")
_POSTER_SELF = "1,576 output tokens/s with the StreamingLLM drafter, 4 drafts (the Vegas poster, the H100 NVL)"
_RFC_WORKLOAD = ("960 prompts of 200 tokens (ASSUMED: an AIME problem in Qwen3's chat template; the prompts barely "
                 "count beside the outputs), 15,000 tokens out, uniform within 90% (ASSUMED: the output lengths are not "
                 "published; a 10k mean puts the modelled plain figure ~1.5x higher: docs/rehearsal.md, the RFC check), max_num_seqs 128, max_num_batched_tokens "
                 "16384 (the offline LLM class's default on a >= 70 GiB GPU), max_model_len 40,960, vLLM's scheduler "
                 "(the rehearsal's vllm config)")
_RFC_DRAFTS = ("the fork's StreamingLLM drafter: a sink of one block, a window of 5% of the context (at least 256 "
               "tokens), 4 drafts at a fixed depth (vllm+self), each accepted with probability 0.8 (ASSUMED: MagicDec's "
               "0.79-0.84 per token at 4k-100k; the poster's 4.92 tokens per step at 6 drafts is ~0.88)")
_RFC_QUICK = dict(random_input_len=64, random_output_len=128, num_prompts=8, max_num_seqs=8, max_model_len=1024)


def _rfc(**more) -> dict:
    return dict(random_input_len=200, random_output_len=15_000, random_range_ratio=0.9, num_prompts=960,
                max_num_seqs=128, max_num_batched_tokens=16384, max_model_len=40_960) | more


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
    Point("qwen3-8b AIME25 x32 (H100)", "KV-bound long decode (cache full)", _RFC.format(figure=_RFC_PLAIN),
          "1x H100", _RFC_WORKLOAD, 1000.0, "output_tokens_per_s", "qwen3-8b", "h100", _rfc(), _RFC_QUICK,
          fit=False, stated="assumed", config="vllm"),
    Point("qwen3-8b AIME25 x32 + StreamingLLM 4 (H100)", "self-speculation", _RFC.format(figure=_RFC_SELF), "1x H100",
          _RFC_WORKLOAD + "; " + _RFC_DRAFTS, 1600.0, "output_tokens_per_s", "qwen3-8b", "h100",
          _rfc(spec_acceptance=0.8), _RFC_QUICK, fit=False, stated="assumed", config="vllm+self"),
    Point("qwen3-8b AIME25 x32 (H100 NVL)", "KV-bound long decode (cache full)", _RFC.format(figure=_POSTER_PLAIN),
          "1x H100 NVL", _RFC_WORKLOAD, 940.0, "output_tokens_per_s", "qwen3-8b", "h100-nvl", _rfc(), _RFC_QUICK,
          fit=False, stated="assumed", config="vllm"),
    Point("qwen3-8b AIME25 x32 + StreamingLLM 4 (H100 NVL)", "self-speculation", _RFC.format(figure=_POSTER_SELF),
          "1x H100 NVL", _RFC_WORKLOAD + "; " + _RFC_DRAFTS, 1576.0, "output_tokens_per_s", "qwen3-8b", "h100-nvl",
          _rfc(spec_acceptance=0.8), _RFC_QUICK, fit=False, stated="assumed", config="vllm+self"),
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
