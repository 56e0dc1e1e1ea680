"""Tensor parallel against one rank: prefill and decode tokens/s of LLM(tensor_parallel_size=T).

A random Qwen3-style checkpoint (the embedded SmolLM2's 9 heads split only by 3 and 9) of about
SmolLM2's width unless --model is given; three prompts forked n ways (prefill: the best of the three
one-chunk steps; decode: the median step of all 3n trajectories). Each
size runs on all cores (TP ranks split them). On a CPU the ranks share the same cores and memory
bandwidth and pay a gloo all-reduce per layer, so TP is expected to be slower there; on GPUs each
rank brings its own memory bandwidth.

    python -m bench.tensor_parallel [--model DIR] [--sizes 1,2] [--n 8] [--prompt-len 256] [--gen-len 32]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def random_checkpoint(folder: Path) -> Path:
    import torch
    import transformers

    from engine.testing import write_char_tokenizer
    cfg = transformers.Qwen3Config(vocab_size=32768, hidden_size=576, intermediate_size=1536, num_hidden_layers=12,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                                   max_position_embeddings=4096, tie_word_embeddings=True)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    write_char_tokenizer(folder, cfg.vocab_size)
    return folder


def measure(model: str, size: int, n: int, prompt_len: int, gen_len: int) -> dict:
    import torch

    from engine import LLM, SamplingParams
    torch.set_num_threads(os.cpu_count() or 1)  # each size starts from all cores; TP ranks split them
    params = SamplingParams(n=n, temperature=1.0, seed=7, max_tokens=gen_len, ignore_eos=True)
    with LLM(model, num_kv_blocks=512, tensor_parallel_size=size, dtype="float32") as llm:
        llm.generate([list(range(3, 40))], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        prefill = 0.0
        for first in (3, 5, 7):  # distinct prompts (no prefix-cache hits); the best of three
            llm.add_request(list(range(first, first + prompt_len)), params)
            t = time.perf_counter()
            llm.step()  # the whole prompt fits one chunk at these sizes
            prefill = max(prefill, prompt_len / (time.perf_counter() - t))
        steps = []
        while llm.has_unfinished():
            t = time.perf_counter()
            llm.step()
            steps.append(time.perf_counter() - t)
    return {"prefill_tok_s": prefill, "decode_tok_s": 3 * n / statistics.median(steps)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder (default: a random Qwen3-style checkpoint)")
    ap.add_argument("--sizes", default="1,2", help="tensor-parallel sizes to compare, the first is the baseline")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--gen-len", type=int, default=32)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(random_checkpoint(Path(tmp)))
        res = {s: measure(model, s, args.n, args.prompt_len, args.gen_len) for s in sizes}
    base = res[sizes[0]]
    for s, r in res.items():
        print(f"tensor_parallel_size={s}  prefill {r['prefill_tok_s']:7.1f} tok/s "
              f"({r['prefill_tok_s'] / base['prefill_tok_s']:.2f}x)  decode {r['decode_tok_s']:6.1f} tok/s "
              f"({r['decode_tok_s'] / base['decode_tok_s']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
