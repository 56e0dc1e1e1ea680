"""Sampling: SamplingParams, the sampler, penalties, logprobs, the per-position random keys and stop strings."""
