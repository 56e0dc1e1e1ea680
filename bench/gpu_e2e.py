"""End-to-end decode tokens/s of the engine with and without cascade (prefix-shared) attention.

A random-weight Qwen3-0.6B-shaped model (written once to a temp folder: shapes and dtype are what
matter for speed, not the values), P prompts of L tokens each forked K ways, G tokens per trajectory
with ignore_eos. Both settings share KV through fork; only the decode attention differs.

    python -m bench.gpu_e2e                 # CUDA, bf16, Triton kernels ($OUT/gpu_e2e.json if OUT is set)
    python -m bench.gpu_e2e --tiny          # CPU, a 2-layer model at tiny sizes: checks the code path
    python -m bench.gpu_e2e --kv-cache-dtype fp8_e4m3   # the same with an FP8 KV cache ($OUT/gpu_e2e_fp8_e4m3.json)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from engine.testing import write_char_tokenizer

QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0))
TINY = dict(QWEN3_0_6B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)


def write_random_model(folder: str | Path, shape: dict = QWEN3_0_6B, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """A Qwen3 checkpoint with random N(0, 0.02) weights (norms at 1), written without materialising
    a transformers model (the parameter names come from one built on the meta device)."""
    import torch
    import transformers
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = transformers.Qwen3Config(bos_token_id=2, eos_token_id=1, pad_token_id=0, **shape)
    cfg.architectures = ["Qwen3ForCausalLM"]
    with torch.device("meta"):
        names = {k: v.shape for k, v in transformers.Qwen3ForCausalLM(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    tensors = {}
    for name, shp in names.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        t = torch.ones(shp) if name.endswith("norm.weight") else torch.randn(shp, generator=g) * 0.02
        tensors[name] = t.to(dt).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg.dtype = dtype
    cfg.save_pretrained(folder)
    write_char_tokenizer(folder, cfg.vocab_size)
    return folder


def run_setting(llm, prompts: list[list[int]], k: int, gen: int) -> dict:
    from engine import SamplingParams
    n0 = len(llm.step_log)
    t = time.perf_counter()
    llm.generate(prompts, SamplingParams(n=k, max_tokens=gen, ignore_eos=True, seed=0), use_tqdm=False)
    wall = time.perf_counter() - t
    steps = llm.step_log[n0:]
    decode = [s for s in steps if s.kind == "decode"]
    decode_s = sum(s.schedule_s + s.model_s + s.sample_s for s in decode)
    decode_tokens = sum(s.num_decode_seqs for s in decode)
    return dict(wall_s=wall, gen_tokens=len(prompts) * k * gen, e2e_tok_s=len(prompts) * k * gen / wall,
                decode_tok_s=decode_tokens / decode_s if decode_s else 0.0, decode_steps=len(decode),
                cascade_steps=sum(s.cascade for s in decode), decode_model_ms=1e3 * sum(s.model_s for s in decode)
                / max(1, len(decode)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny model and sizes (a check of the code path)")
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--cases", default="2048x16,8192x16,2048x64", help="prompt_len x K, comma-separated")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for gpu_e2e.json")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8_e4m3", "fp8_e5m2"),
                    help="KV cache format of both settings (default auto: the model's bf16)")
    args = ap.parse_args(argv)
    import torch
    from engine import LLM
    if args.tiny:
        device, dtype, shape = "cpu", "float32", TINY
        args.problems, args.cases, args.gen_len = 2, "64x4,48x3", 8
    elif not torch.cuda.is_available():
        print("gpu_e2e: no CUDA device (use --tiny on CPU)", file=sys.stderr)
        return 2
    else:
        device, dtype, shape = "cuda", "bfloat16", QWEN3_0_6B
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    folder = write_random_model(Path(tempfile.mkdtemp(prefix="pacore_e2e_")) / "qwen3", shape, dtype)
    bs = 16
    need = max(args.problems * (-(-plen // bs) + k * (-(-args.gen_len // bs) + 1)) for plen, k in cases)
    engines = {on: LLM(str(folder), dtype=dtype, device=device, num_kv_blocks=need + 64, record_steps=True,
                       cascade_attention=on, kv_cache_dtype=args.kv_cache_dtype, max_num_seqs=max(args.problems * k for _, k in cases))
               for on in (True, False)}
    g = torch.Generator().manual_seed(0)
    rows = []
    for plen, k in cases:
        prompts = torch.randint(3, shape["vocab_size"], (args.problems, plen), generator=g).tolist()
        for i, on in enumerate((True, False) if len(rows) % 4 == 0 else (False, True)):  # interleaved order
            llm = engines[on]
            # Warm-up (kernel compilation) on other tokens, so the prefix cache gives the real run nothing.
            run_setting(llm, [[3 + (t * 7 + j) % 97 for t in range(64)] for j in range(args.problems)], k, 4)
            r = run_setting(llm, prompts, k, args.gen_len)
            rows.append(dict(prompt_len=plen, k=k, problems=args.problems, cascade=on, **r))
    lines = [f"{'prompt':>7}{'K':>4}{'cascade':>8}{'decode tok/s':>14}{'e2e tok/s':>11}{'model ms/step':>15}"
             f"{'cascade/paged':>15}"]
    for plen, k in cases:
        on, off = (next(r for r in rows if r["prompt_len"] == plen and r["k"] == k and r["cascade"] == c)
                   for c in (True, False))
        for r in (on, off):
            ratio = f"{on['decode_tok_s'] / off['decode_tok_s']:.2f}x" if r is on and off["decode_tok_s"] else ""
            lines.append(f"{plen:>7}{k:>4}{str(r['cascade']):>8}{r['decode_tok_s']:>14.0f}{r['e2e_tok_s']:>11.0f}"
                         f"{r['decode_model_ms']:>15.2f}{ratio:>15}")
    dev_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    table = f"end-to-end decode, {'tiny random' if args.tiny else 'Qwen3-0.6B-shaped random'} model, " \
            f"{dtype}, KV {engines[True].stats()['kv_cache_dtype']}, {dev_name}, P={args.problems}, G={args.gen_len}\n" \
        + "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = "gpu_e2e" if args.kv_cache_dtype == "auto" else f"gpu_e2e_{args.kv_cache_dtype}"
        (Path(args.out) / f"{name}.json").write_text(json.dumps(dict(device=dev_name, dtype=dtype, kv_cache_dtype=
                                                                  args.kv_cache_dtype, rows=rows), indent=1))
        (Path(args.out) / f"{name}_table.txt").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
