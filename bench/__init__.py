"""Benchmarks: PaCoRe throughput vs transformers, roofline, per-step profiles, microbenchmarks.

    python -m bench.pacore_throughput --quick      # engine vs HF generate / generate_batch, per round
    python -m bench.roofline --quick               # decode/prefill steps against the byte/FLOP floors
    python -m bench.profile_run --out runs/prof    # step timeline + torch.profiler traces of a run
    bench/gpu/check.sh [more|--dry-run]            # the GPU plan: one command that fits a lease (CUDA)
    python -m bench.gpu.e2e [--tiny]               # the engine end to end at Qwen3-8B's shape (CUDA)
    python -m bench.batch_invariant_cost           # LLM(batch_invariant=True) vs default, prefill/decode tok/s
    python -m bench.replicas [--ray]               # pacore run on 2 data-parallel replicas vs 1, tokens/s
    python -m bench.serve_sharing                  # pacore serve: prefill of K concurrent n=1 requests vs one n=K
    python -m bench.logprobs_cost                  # the sampler step without / with top-20 logprobs (--record-confidence)
    python -m bench.sampler_cost                   # the CPU sampler per step: Gumbel-max as plainly stated vs as drawn
    python -m bench.spec_acceptance                # speculative drafts' acceptance on the embedded model: the rehearsal's profile
    python -m pytest bench/bench_decode.py bench/bench_host.py --benchmark-only   # microbenchmarks
"""
