"""Prefill tokens ``pacore serve`` spends on one round's prompt, read from its /metrics.

Three ways to sample K trajectories of one chat prompt over HTTP: K concurrent n=1 requests (the
reference PaCoRe client's pattern), one request with n=K (one fork), and K concurrent n=1 requests
with the prefix cache off (what a server without sharing computes). Each runs against a server in
this process (a fresh one per case, so nothing is cached before it), driven by the openai client;
the prompt is a PaCoRe synthesis prompt (the controller template holding K references).

    python -m bench.serve_sharing [--model DIR] [--k 8] [--max-tokens 16] [--threads 1]
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from bench.profile_run import apply_threads

PROBLEM = ("Let N be the number of ordered triples (a, b, c) of positive integers with a * b * c = 2025 "
           "and a <= b <= c. Find N, and justify every step of the count.")


def synthesis_messages(k: int) -> list[dict]:
    """A round-2 prompt: the problem and k references in the controller template."""
    from pacore.prompts import round_messages
    refs = [f"Reference draft {i}: factor 2025 = 3^4 * 5^2, count the ways to split the exponents among "
            f"a, b, c, then keep the ordered ones with a <= b <= c. My count is {10 + i}." for i in range(k)]
    return round_messages([{"role": "user", "content": PROBLEM}], refs, empty_bypasses=False)


def measure(model: str | None, k: int, max_tokens: int, requests: int, n: int, prefix_caching: bool) -> dict:
    """``requests`` concurrent requests of n choices each against a fresh server (nothing cached)."""
    import httpx
    import openai
    from prometheus_client.parser import text_string_to_metric_families

    from engine import LLM
    from engine.serve.app import create_app
    from engine.serve.background import serve_in_background

    def prefill(base: str) -> float:
        families = text_string_to_metric_families(httpx.get(f"{base}/metrics").text)
        return next(f.samples[0].value for f in families if f.name == "pacore_prefill_tokens")

    llm = LLM(model, num_kv_blocks=1024, enable_prefix_caching=prefix_caching)
    with serve_in_background(create_app(llm, "bench")) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        messages = synthesis_messages(k)

        def ask(_):
            return client.chat.completions.create(model="bench", messages=messages, n=n, max_tokens=max_tokens,
                                                  temperature=1.0, extra_body={"ignore_eos": True})
        t = time.perf_counter()
        with ThreadPoolExecutor(requests) as pool:
            replies = list(pool.map(ask, range(requests)))
        return {"prompt": replies[0].usage.prompt_tokens, "prefill": prefill(base),
                "wall_s": time.perf_counter() - t}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--k", type=int, default=8, help="trajectories per round (default 8)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per trajectory (default 16)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)
    apply_threads(args.threads)
    k = args.k
    rows = {"K x n=1": measure(args.model, k, args.max_tokens, k, 1, prefix_caching=True),
            "1 x n=K": measure(args.model, k, args.max_tokens, 1, k, prefix_caching=True),
            "K x n=1, no prefix cache": measure(args.model, k, args.max_tokens, k, 1, prefix_caching=False)}
    print(f"K={args.k}, {args.max_tokens} tokens per trajectory, one chat prompt per case")
    print(f"{'case':<26}{'prompt tok':>11}{'prefilled':>11}{'x prompt':>10}{'wall s':>8}")
    for name, r in rows.items():
        print(f"{name:<26}{r['prompt']:>11}{r['prefill']:>11.0f}{r['prefill'] / r['prompt']:>10.2f}{r['wall_s']:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
