"""PaCoRe Engine: paged, prefix-shared KV cache; fork of one prompt into K trajectories."""
from engine.llm import LLM, StepError
from engine.sampling_params import SamplingParams
from engine.sequence import CompletionOutput, RequestMetrics, RequestOutput

__all__ = ["LLM", "StepError", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"]
