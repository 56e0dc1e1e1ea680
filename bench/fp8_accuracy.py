"""FP8 accuracy against the model dtype, on CPU (the torch path): the KV cache, or with --weights the
weights (quantization="fp8": per-channel e4m3 projections, per-token activations), alone and with an
e4m3 cache.

For each model and FP8 variant, against the model dtype's weights and cache:

- greedy agreement: the same prompts decoded greedily for --tokens tokens (ignore_eos) with each
  cache: the share of generated tokens before a prompt's first divergence, and how many prompts
  agree over all of them;
- teacher-forced KL: the auto run's tokens are forced into the FP8 engine (its sampler returns them),
  so both see the same history at every decode step; KL(p_auto || p_fp8) of the next-token
  distributions (mean and max over all positions) and top-1 agreement there.

Models: SmolLM2-135M-Instruct (the embedded default) and tiny random Qwen3 / Llama checkpoints
(tests/tiny_models.py). The tables are in docs/gpu.md.

    python -m bench.fp8_accuracy [--weights] [--tokens 256] [--models smollm2,qwen3,llama] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "Question: what is 17 * 23? Think step by step.\nAnswer:",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why the sky is blue to a ten-year-old.",
    "List the first ten prime numbers and explain how you found them.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The French Revolution began in 1789 because",
    "Translate to French: The weather is nice today and we are going to the beach.",
    "Solve for x: 3x + 7 = 25. Show your work.",
]
# variant -> LLM options, against the model dtype's weights and cache
KV_VARIANTS = {"fp8_e4m3": {"kv_cache_dtype": "fp8_e4m3"}, "fp8_e5m2": {"kv_cache_dtype": "fp8_e5m2"}}
WEIGHT_VARIANTS = {"fp8 weights": {"quantization": "fp8"},
                   "fp8 weights + fp8_e4m3 KV": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}}


def run(llm, prompts, tokens: int, forced: list[list[int]] | None = None):
    """Greedy (or forced) generation; returns each prompt's tokens and its fp32 logits per step."""
    import torch

    from engine import SamplingParams
    logits: dict[int, list] = {}
    greedy = llm.sampler

    def sampler(rows, seqs, offsets=None, keys=None):  # the engine's sampler signature; no speculation here
        for row, seq in zip(rows, seqs):
            logits.setdefault(int(seq.request.request_id), []).append(row.float().clone())
        if forced is None:
            return greedy(rows, seqs, offsets, keys)
        return [forced[int(s.request.request_id)][s.num_generated] for s in seqs]
    llm.sampler = sampler
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        llm.add_request(p, params, request_id=str(i))
    out = {}
    while llm.has_unfinished():
        out |= {int(o.request_id): o.outputs[0].token_ids for o in llm.step()}
    llm.sampler = greedy
    return [out[i] for i in range(len(prompts))], [torch.stack(logits[i]) for i in range(len(prompts))]


def compare(llm_auto, make_fp8, prompts, tokens: int, variants=KV_VARIANTS) -> list[dict]:
    import torch
    base_tokens, base_logits = run(llm_auto, prompts, tokens)
    rows = []
    for fmt, options in variants.items():
        fp8 = make_fp8(options)
        free, _ = run(fp8, prompts, tokens)
        prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(base_tokens, free)]
        _, forced_logits = run(fp8, prompts, tokens, forced=base_tokens)
        p = torch.cat(base_logits).log_softmax(-1)
        q = torch.cat(forced_logits).log_softmax(-1)
        kl = (p.exp() * (p - q)).sum(-1)
        rows.append(dict(format=fmt, prompts=len(prompts), tokens=tokens,
                         greedy_agree_share=sum(prefix) / (tokens * len(prompts)),
                         prompts_all_agree=sum(n == tokens for n in prefix),
                         kl_mean=kl.mean().item(), kl_max=kl.max().item(),
                         forced_top1_agree=(p.argmax(-1) == q.argmax(-1)).float().mean().item()))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--models", default="smollm2,qwen3,llama")
    ap.add_argument("--weights", action="store_true", help="FP8 weights (alone and with an FP8 e4m3 cache) "
                    "instead of the FP8 KV formats")
    ap.add_argument("--out", default=None, help="folder for fp8_accuracy.json (fp8_weights_accuracy.json) and its table")
    args = ap.parse_args(argv)
    import torch

    from engine import LLM
    torch.manual_seed(0)
    results = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        if name == "smollm2":
            path, prompts = None, PROMPTS
        else:
            from tests.tiny_models import make_tiny_model
            path = str(make_tiny_model(Path(tempfile.mkdtemp(prefix="pacore_fp8_")) / name, name))
            prompts = [torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
                       for n in (7, 20, 33, 60, 90, 120, 150, 200)]
        kw = dict(device="cpu", dtype="float32", num_kv_blocks=1024, max_num_seqs=len(prompts))
        variants = WEIGHT_VARIANTS if args.weights else KV_VARIANTS
        rows = compare(LLM(path, **kw), lambda options: LLM(path, **options, **kw), prompts, args.tokens, variants)
        for r in rows:
            r["model"] = "SmolLM2-135M" if name == "smollm2" else f"tiny {name} (random)"
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)  # as each model finishes: a long run keeps them
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    head = (f"| model | {'FP8' if args.weights else 'KV'} | greedy tokens agreeing (before the first divergence) | prompts agreeing on all "
            f"{args.tokens} | KL mean | KL max | teacher-forced top-1 agree |")
    lines = [head, "|" + "---|" * 7]
    for r in results:
        lines.append(f"| {r['model']} | {r['format']} | {100 * r['greedy_agree_share']:.1f}% | "
                     f"{r['prompts_all_agree']}/{r['prompts']} | {r['kl_mean']:.2e} | {r['kl_max']:.2e} | "
                     f"{100 * r['forced_top1_agree']:.1f}% |")
    what = "FP8 weights" if args.weights else "FP8 KV"
    table = (f"{what} vs the model dtype's (fp32), CPU, greedy, {args.tokens} tokens per prompt; KL(p_auto || "
             f"p_fp8) in nats over the teacher-forced positions\n" + "\n".join(lines))
    print(table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        stem = "fp8_weights_accuracy" if args.weights else "fp8_accuracy"
        (Path(args.out) / f"{stem}.json").write_text(json.dumps(results, indent=1))
        (Path(args.out) / f"{stem}_table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
