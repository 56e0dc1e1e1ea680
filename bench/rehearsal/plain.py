"""Plain workloads in ``vllm bench``'s words, rehearsed: so that a public benchmark can be rehearsed as it ran.

    python -m bench.rehearsal --dataset-name random --random-input-len 1024 --random-output-len 1024 \\
        --num-prompts 1000 --device h100 --shape llama3-8b

``--dataset-name random`` is vLLM's random dataset: every prompt ``--random-input-len`` random token ids
(distinct prompts: no prefix is shared), every request ``--random-output-len`` tokens out (as
``--ignore-eos``), both fixed or, with ``--random-range-ratio r``, uniform within r of them, ``--n`` samples each (children of one prompt, as vLLM's ``n``). ``--max-concurrency``
keeps at most that many requests in flight (all at once without it: ``vllm bench throughput``).
``--gpu-memory-utilization`` has vLLM's meaning: the fraction of the GPU's whole memory the engine may take,
weights, activations and KV together; the KV cache gets what is left (engine/device_model.py, kv_tokens).
It prints output tokens/s, mean TTFT, TPOT and ITL, and the KV cache's tokens, as vLLM does.

Each step's work is kept (``Trace``), so the same schedule can be priced again on other device figures
without rehearsing it again (bench/rehearsal/calibration.py fits the device model so).
"""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field

from engine.config import positive_int
from engine.device_model import DeviceParams, StepWork, step_cost

from bench.rehearsal.checks import BLOCK_SIZE, Refused, probability


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The plain workload's flags, in vllm bench's words (one group of the rehearsal's command)."""
    g = p.add_argument_group("plain workload (vllm bench's words): instead of PaCoRe, --dataset-name random")
    g.add_argument("--dataset-name", choices=("random",), help="rehearse a plain workload instead of PaCoRe")
    g.add_argument("--random-input-len", type=positive_int, default=1024, help="prompt tokens (default 1024)")
    g.add_argument("--random-output-len", type=positive_int, default=128, help="output tokens (default 128)")
    g.add_argument("--random-range-ratio", type=_ratio, default=0.0,
                   help="lengths drawn uniformly within this fraction of --random-input-len/--random-output-len, "
                        "as vllm bench's random dataset (default 0: fixed)")
    g.add_argument("--num-prompts", type=positive_int, default=1000, help="prompts (default 1000)")
    g.add_argument("--max-concurrency", type=positive_int, help="requests in flight at most (default: all at once)")
    g.add_argument("--n", type=positive_int, default=1, help="samples per prompt (default 1)")
    g.add_argument("--gpu-memory-utilization", type=probability, default=0.9,
                   help="the fraction of the GPU's memory the engine may take: weights, activations and KV (vLLM's "
                        "meaning; default 0.9)")
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=8192,
                   help="tokens one step may compute (vLLM's chunked-prefill budget; default 8192)")
    g.add_argument("--self-draft", type=positive_int, metavar="K",
                   help="self-drafting (sink 16 + window 512 of the model's own KV) up to K tokens, each accepted "
                        "with --spec-acceptance (default 0.8)")


def _ratio(value: str) -> float:
    x = probability(value)
    if x >= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value!r}")
    return x


@dataclass(slots=True)
class Trace:
    """What a plain rehearsal did, step by step: each step's work (``works``; ``bounds[s]``: the works
    up to the end of engine step s, its draft steps first), and per request (the engine steps done when
    it was added, the step of its first token, of its last, the steps it emitted in, its longest child's
    tokens, all its children's tokens)."""

    works: list[StepWork] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)
    requests: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    input_tokens: int = 0
    kv_tokens: int = 0


def rehearse_plain(llm, input_len: int, output_len: int, num_prompts: int, n: int = 1,
                   max_concurrency: int | None = None, seed: int = 0, range_ratio: float = 0.0) -> Trace:
    """Run the workload on a rehearsed LLM (``device_model`` set) through its step API; its Trace.
    ``range_ratio``: each prompt's lengths uniform in [len x (1 - r), len x (1 + r)], as vLLM's random dataset."""
    from engine import SamplingParams
    rng = random.Random(seed)
    vocab = min(llm.config.vocab_size, 49_152)
    span = lambda x: rng.randint(max(1, int(x * (1 - range_ratio))), max(1, int(x * (1 + range_ratio))))  # noqa: E731
    lengths = [(span(input_len), span(output_len)) for _ in range(num_prompts)]
    prompts = [([rng.randrange(1000, vocab) for _ in range(i)], SamplingParams(n=n, max_tokens=o, ignore_eos=True))
               for i, o in lengths]
    trace = Trace(input_tokens=sum(i for i, _ in lengths), kv_tokens=llm.block_manager.num_blocks * llm.block_size)
    llm.runner.trace = trace.works
    limit = max_concurrency or num_prompts
    pending = iter(prompts)
    live: dict[str, list] = {}  # request id -> [added, first, emits, tokens seen]
    steps = 0
    while True:
        while len(live) < limit and (p := next(pending, None)) is not None:
            live[llm.add_request(*p)] = [steps, -1, 0, 0]
        if not live:
            break
        done = llm.step()
        trace.bounds.append(len(trace.works))
        # only a request with a running sequence emitted (one that finished is counted below): with hundreds
        # waiting, looking at each of them every step would cost more than the step itself
        for rid in {s.request.request_id for s in llm.scheduler.running}:
            rec, req = live.get(rid), llm.requests.get(rid)
            if rec is None or req is None:
                continue
            seen = sum(s.num_generated for s in req.seqs)
            if seen > rec[3]:
                rec[1] = steps if rec[1] < 0 else rec[1]
                rec[2] += 1
                rec[3] = seen
        for out in done:
            rec = live.pop(out.request_id)
            tokens = max(len(c.token_ids) for c in out.outputs)
            total = sum(len(c.token_ids) for c in out.outputs)
            if total > rec[3]:  # tokens in its last step
                rec[1] = steps if rec[1] < 0 else rec[1]
                rec[2] += 1
            trace.requests.append((rec[0], rec[1], steps, rec[2], tokens, total))
        steps += 1
    llm.runner.trace = None
    return trace


def figures(trace: Trace, shape, device: DeviceParams, step_seconds=None) -> dict:
    """vllm bench's figures of a trace priced on ``device`` (``step_seconds``: each engine step's
    seconds, already priced, e.g. by calibration.py; else each work through engine/device_model.py)."""
    if step_seconds is None:
        per_work = [step_cost(w, shape, device)[0].total for w in trace.works]
        step_seconds, at = [], 0
        for b in trace.bounds:
            step_seconds.append(sum(per_work[at:b]))
            at = b
    ends, t = [], 0.0
    for s in step_seconds:
        t += s
        ends.append(t)
    start = lambda added: ends[added - 1] if added else 0.0  # noqa: E731 - the end of the step before
    out_tokens = ttft = tpot = gap_sum = 0.0
    gaps = 0
    reqs = trace.requests
    for added, first, last, emits, tokens, total in reqs:
        out_tokens += total
        ttft += ends[first] - start(added)
        if tokens > 1:
            tpot += (ends[last] - ends[first]) / (tokens - 1)
        gap_sum += ends[last] - ends[first]
        gaps += max(0, emits - 1)
    duration = ends[-1] if ends else 0.0
    count = max(1, len(reqs))
    return {"requests": len(reqs), "duration_s": duration, "input_tokens": trace.input_tokens,
            "output_tokens": int(out_tokens), "output_tokens_per_s": out_tokens / duration if duration else 0.0,
            "total_tokens_per_s": (out_tokens + trace.input_tokens) / duration if duration else 0.0,
            "requests_per_s": len(reqs) / duration if duration else 0.0,
            "mean_ttft_ms": 1e3 * ttft / count, "mean_tpot_ms": 1e3 * tpot / count,
            "mean_itl_ms": 1e3 * gap_sum / gaps if gaps else 0.0, "kv_tokens": trace.kv_tokens,
            "steps": len(trace.bounds)}


def engine_options(args) -> dict:
    """The rehearsed engine's options for a plain workload: vLLM's sizing by --gpu-memory-utilization."""
    opts = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": args.max_model_len or int((args.random_input_len + args.random_output_len)
                                                       * (1 + args.random_range_ratio)) + 2}
    if args.self_draft:
        opts["speculative_config"] = {"method": "self_window", "num_speculative_tokens": args.self_draft,
                                      "window": 512, "sink": 16}
    return opts


def run(args, folder, device: DeviceParams, options: dict | None = None, profiles=None) -> dict:
    """Rehearse the plain workload the flags describe; its figures (Refused: what cannot be rehearsed).
    ``options``: a configuration's engine options (bench/rehearsal's CONFIGS), under the benchmark's own limits
    (the flags' max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, max_model_len win); ``profiles``:
    its drafts' acceptance (bench/rehearsal's spec_profiles; None: --self-draft's, flat at --spec-acceptance)."""
    from engine import LLM
    opts = (options or {}) | engine_options(args)
    longest = int((args.random_input_len + args.random_output_len) * (1 + args.random_range_ratio)) + 2
    if opts["max_model_len"] < longest:
        raise Refused(f"--max-model-len {opts['max_model_len']} is shorter than the longest request ({longest:,} tokens: "
                      f"--random-input-len + --random-output-len, by --random-range-ratio); raise it")
    kv = _kv_tokens(folder, device, opts)  # before the engine: its bookkeeping of the blocks is this CPU's memory
    if kv > args.max_kv_tokens:
        raise Refused(f"the modelled KV cache would hold {kv:,} tokens, beyond --max-kv-tokens={args.max_kv_tokens:,}"
                      f"; lower --gpu-memory-utilization or raise --max-kv-tokens")
    try:
        llm = LLM(str(folder), tokenizer=str(folder / "tokenizer"), device_model=args.device, block_size=BLOCK_SIZE,
                  **opts)
    except ValueError as e:
        raise Refused(f"the rehearsed engine refused the plain workload: {e}") from None
    if llm.speculator is not None:
        from engine.rehearsal.drafter import WindowProfile, use_scripted_drafter, use_scripted_self_drafts
        if profiles is None:
            p = 0.8 if args.spec_acceptance is None else args.spec_acceptance
            profiles = WindowProfile.flat(p, llm.speculator.config.num_speculative_tokens)
        if llm.speculator.self_drafting:
            use_scripted_self_drafts(llm, profiles, seed=args.seed)
        else:
            use_scripted_drafter(llm, profiles, seed=args.seed)
    trace = rehearse_plain(llm, args.random_input_len, args.random_output_len, args.num_prompts, args.n,
                           args.max_concurrency, args.seed, args.random_range_ratio)
    return figures(trace, llm.runner.shape, llm.runner.device_params) | {"trace": trace, "shape": llm.runner.shape}


def _kv_tokens(folder, device: DeviceParams, opts: dict) -> int:
    import torch

    from engine.config import ModelConfig
    from engine.device_model import kv_tokens
    from engine.worker.kv_cache import resolve_kv_dtype
    from engine.core.step_shape import ModelShape
    kv = resolve_kv_dtype(opts.get("kv_cache_dtype", "auto"), torch.bfloat16)
    shape = ModelShape.from_config(ModelConfig.from_pretrained(folder), torch.bfloat16.itemsize, kv.itemsize)
    return kv_tokens(shape, device, opts["gpu_memory_utilization"])


def print_figures(f: dict, device: DeviceParams, config: str = "") -> None:
    """The figures as vllm bench prints its own (modelled: virtual seconds on ``device``)."""
    what = f"{config}, " if config else ""
    print(f"============ Rehearsed benchmark result ({what}modelled {device.name}: {device.source}) ============")
    rows = [("Successful requests", f"{f['requests']}"), ("Benchmark duration (virtual s)", f"{f['duration_s']:.2f}"),
            ("Total input tokens", f"{f['input_tokens']}"), ("Total generated tokens", f"{f['output_tokens']}"),
            ("Output token throughput (tok/s)", f"{f['output_tokens_per_s']:.2f}"),
            ("Mean TTFT (ms)", f"{f['mean_ttft_ms']:.2f}"), ("Mean TPOT (ms)", f"{f['mean_tpot_ms']:.2f}"),
            ("Mean ITL (ms)", f"{f['mean_itl_ms']:.2f}"), ("GPU KV cache size (tokens)", f"{f['kv_tokens']:,}"),
            ("Engine steps", f"{f['steps']}")]
    for k, v in rows:
        print(f"{k + ':':<40} {v}")
