"""What ``LLM.add_request`` refuses, each with an error that names the problem and the fix: prompts
that are no text or no token ids, requests that can never fit, resumes that do not match."""
from __future__ import annotations

import numbers

from engine.sample.logprobs import TokenLogprobs
from engine.sample.sampling_params import SamplingParams
from engine.core.sequence import Partial


def check_text(text: str) -> None:
    """Raise ValueError if ``text`` is no Unicode text (a lone surrogate, which JSON can escape and
    tokenizers break on). The engine checks every text prompt; the server checks each message."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"prompt is not valid Unicode text ({e.reason} at character {e.start}); "
                         "remove lone surrogates or pass token ids") from None


def prompt_ids(prompt: str | list[int], tokenizer, vocab_size: int) -> tuple[str | None, list[int]]:
    """(text or None, token ids) of a prompt given as text or token ids, checked."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer (skip_tokenizer_init=True): pass token ids")
        check_text(prompt)
        text, ids = prompt, tokenizer.encode(prompt)  # special tokens as vLLM adds them
    else:
        text = None
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            raise ValueError("prompt must be a string or a list of integer token ids")
        ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("empty prompt: give at least one token")
    check_vocab("prompt", ids, vocab_size)
    return text, ids


def check_vocab(what: str, ids: list[int], vocab_size: int) -> None:
    if any(t < 0 or t >= vocab_size for t in ids):
        raise ValueError(f"{what} has token ids outside the vocabulary [0, {vocab_size})")


def check_stop_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """A stop token the model can never emit would stop nothing: refused, naming the vocabulary's size."""
    bad = [t for t in params.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"SamplingParams.stop_token_ids {bad[:5]} are outside the model's vocabulary of {vocab_size} "
                         f"tokens (ids 0 to {vocab_size - 1}); the model can never emit them, so they would stop nothing")


def check_fits(num_prompt: int, params: SamplingParams, max_model_len: int, num_blocks: int,
               block_size: int) -> None:
    """Refuse a request that can never run: beyond the context, or the whole KV cache."""
    total = num_prompt + params.max_tokens
    if total > max_model_len:
        raise ValueError(f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) exceeds "
                         f"max_model_len={max_model_len}; shorten the prompt, lower max_tokens "
                         "or raise max_model_len")
    cache_tokens = num_blocks * block_size
    if total > cache_tokens:
        raise ValueError(f"prompt ({num_prompt}) + max_tokens ({params.max_tokens}) needs more than the whole "
                         f"KV cache ({cache_tokens} tokens); lower max_tokens or max_model_len, or give the "
                         "cache more memory")
    if params.n > num_blocks:
        raise ValueError(f"n={params.n} trajectories exceed the KV cache's {num_blocks} blocks: each "
                         f"trajectory decodes into blocks of its own, so lower n or give the cache more memory")


def check_max_logprobs(max_logprobs: int, vocab_size: int) -> None:
    """At start-up: the top alternatives a request may ask for cannot outnumber the vocabulary."""
    if max_logprobs > vocab_size:
        raise ValueError(f"max_logprobs={max_logprobs} (--max-logprobs) is above the model's vocabulary of "
                         f"{vocab_size} tokens; give at most {vocab_size}")


def check_logprobs(params: SamplingParams, max_logprobs: int, vocab_size: int, rehearsal: bool = False) -> None:
    """logprobs / prompt_logprobs within the engine's max_logprobs and the vocabulary (a step's top-N
    over more tokens than there are would fail every request in it), and not on a modelled device."""
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is None:
            continue
        if rehearsal:
            raise ValueError(f"SamplingParams.{name}: a rehearsal (device_model) computes no logits; leave it None")
        if value > max_logprobs:
            raise ValueError(f"SamplingParams.{name}={value} is above this engine's max_logprobs={max_logprobs}; "
                             f"ask for at most {max_logprobs}, or start the engine with a larger max_logprobs "
                             "(--max-logprobs)")
        if value > vocab_size:
            raise ValueError(f"SamplingParams.{name}={value} is above the model's vocabulary of {vocab_size} "
                             f"tokens; ask for at most {vocab_size}")
    if params.logit_bias:
        check_vocab("SamplingParams.logit_bias", list(params.logit_bias), vocab_size)


def check_resume_logprobs(params: SamplingParams, resume: list[Partial],
                          resume_logprobs: list[TokenLogprobs | None] | None) -> None:
    """Each child's earlier logprobs must cover exactly its resumed tokens, at the request's top-N; a
    finished child must bring them (it never runs again, so they cannot be recomputed)."""
    if resume_logprobs is None:
        resume_logprobs = [None] * len(resume)
    elif params.logprobs is None:
        raise ValueError("resume_logprobs given, but the request does not ask for logprobs: set "
                         "SamplingParams.logprobs or leave resume_logprobs out")
    if len(resume_logprobs) != len(resume):
        raise ValueError(f"resume_logprobs has {len(resume_logprobs)} children but resume has {len(resume)}")
    for i, ((tokens, reason), lp) in enumerate(zip(resume, resume_logprobs)):
        if lp is None:
            if params.logprobs is not None and reason is not None and tokens:
                raise ValueError(f"resume[{i}] is finished, so its logprobs cannot be recomputed: pass them as "
                                 f"resume_logprobs[{i}] (what partial_logprobs returned)")
            continue
        if not isinstance(lp, TokenLogprobs):
            raise ValueError(f"resume_logprobs[{i}] must be a TokenLogprobs (what partial_logprobs returned) "
                             f"or None, got {type(lp).__name__}")
        if len(lp) != len(tokens) or list(tokens) != lp.token_ids:
            raise ValueError(f"resume_logprobs[{i}] covers {len(lp)} tokens that are not resume[{i}]'s "
                             f"{len(tokens)}; pass the partial_logprobs taken with those partial_outputs, or None "
                             "to recompute them")
        if lp.num_top != params.logprobs:
            raise ValueError(f"resume_logprobs[{i}] has the top {lp.num_top} but the request asks for "
                             f"logprobs={params.logprobs}")


def check_resume(params: SamplingParams, resume: list[Partial], vocab_size: int) -> None:
    """A resume must give each of the n children tokens within max_tokens, and leave one to run."""
    if len(resume) != params.n:
        raise ValueError(f"resume has {len(resume)} children but the request has n={params.n}")
    for i, (tokens, reason) in enumerate(resume):
        if reason not in (None, "stop", "length"):
            raise ValueError(f"resume[{i}]: finish reason must be None, 'stop' or 'length', got {reason!r}")
        if len(tokens) > params.max_tokens or (reason is None and len(tokens) >= params.max_tokens):
            raise ValueError(f"resume[{i}] has {len(tokens)} tokens, beyond max_tokens={params.max_tokens}")
        check_vocab(f"resume[{i}]", tokens, vocab_size)
    if all(reason is not None for _, reason in resume):
        raise ValueError("resume: every child is already finished; there is nothing to run")
