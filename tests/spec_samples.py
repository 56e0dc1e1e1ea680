"""Many short unseeded trajectories from one prompt, for the distribution tests of speculative decoding."""
from collections import Counter

from engine import LLM, SamplingParams

PROMPT = [3, 4, 3, 4, 3]  # repetitive: n-gram drafts are proposed at almost every position
# Penalties on every sample (baseline and speculative alike): each query's must see the drafts before it
PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2)


def samples(model, spec, n=4000, requests=5, sampler_seed=3):
    """(n x requests trajectories of 5 tokens at temperature 1 with PENALTIES, the engine). Every trajectory of a request
    is forked at once (n <= max_num_seqs): five big steps per request."""
    llm = LLM(str(model), skip_tokenizer_init=True, max_num_seqs=n, max_num_batched_tokens=5 * n,
              speculative_config=spec, seed=sampler_seed)  # a token budget for every row's drafts
    params = SamplingParams(n=n, temperature=1.0, max_tokens=5, ignore_eos=True, **PENALTIES)
    outs = llm.generate([PROMPT] * requests, params, use_tqdm=False)
    return [o.token_ids for r in outs for o in r.outputs], llm


def chi2_p(a: Counter, b: Counter) -> float:
    """p-value of a two-sample chi-square test (bins with fewer than 20 samples in all merged)."""
    from scipy.stats import chi2_contingency
    rows, rest = [], [0, 0]
    for k in set(a) | set(b):
        if a[k] + b[k] >= 20:
            rows.append([a[k], b[k]])
        else:
            rest[0] += a[k]
            rest[1] += b[k]
    if sum(rest):
        rows.append(rest)
    return chi2_contingency(rows)[1]


def same_distribution(base, ours, positions=(2, 3, 4)) -> list[float]:
    """The chi-square p-value of each position's tokens, base against ours."""
    return [chi2_p(Counter(t[p] for t in base), Counter(t[p] for t in ours)) for p in positions]
