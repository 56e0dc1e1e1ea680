"""What LLM(batch_invariant=True) costs: prefill and decode tokens/s against the default engine.

One prompt forked n ways, both engines stepped in turn (so machine noise hits both alike); decode is
the median step. Prints one line per mode and the ratios.

    python -m bench.batch_invariant_cost [--model DIR] [--n 8] [--prompt-len 512] [--gen-len 64] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

from bench.profile_run import apply_threads


def measure(model: str | None, n: int, prompt_len: int, gen_len: int) -> dict[bool, dict]:
    from engine import LLM, SamplingParams
    params = SamplingParams(n=n, temperature=1.0, seed=7, max_tokens=gen_len, ignore_eos=True)
    llms = {bi: LLM(model, num_kv_blocks=1024, batch_invariant=bi) for bi in (False, True)}
    out: dict[bool, dict] = {}
    decode: dict[bool, list[float]] = {False: [], True: []}
    for bi, llm in llms.items():
        llm.add_request(list(range(3, 3 + prompt_len)), params)
        t = time.perf_counter()
        llm.step()  # the whole prompt fits one chunk at these sizes
        out[bi] = {"prefill_tok_s": prompt_len / (time.perf_counter() - t)}
    while all(llm.has_unfinished() for llm in llms.values()):
        for bi, llm in llms.items():
            t = time.perf_counter()
            llm.step()
            decode[bi].append(time.perf_counter() - t)
    for bi in llms:
        out[bi]["decode_tok_s"] = n / statistics.median(decode[bi])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    apply_threads(args.threads)
    res = measure(args.model, args.n, args.prompt_len, args.gen_len)
    for bi, r in res.items():
        print(f"batch_invariant={bi!s:5}  prefill {r['prefill_tok_s']:7.1f} tok/s  decode {r['decode_tok_s']:6.1f} tok/s")
    print(f"ratio (invariant / default): prefill {res[True]['prefill_tok_s'] / res[False]['prefill_tok_s']:.2f}x, "
          f"decode {res[True]['decode_tok_s'] / res[False]['decode_tok_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
