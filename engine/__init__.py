"""PaCoRe Engine: paged, prefix-shared KV cache; fork of one prompt into K trajectories."""
from engine.sample.sampling_params import SamplingParams

__all__ = ["LLM", "StepError", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"]
_LAZY = {"LLM": "engine.llm", "StepError": "engine.core.step_errors", "RequestOutput": "engine.core.sequence",
         "CompletionOutput": "engine.core.sequence", "RequestMetrics": "engine.core.sequence"}


def __getattr__(name: str):
    # The engine proper pulls in torch; SamplingParams alone (the CLI's flag checks) must not.
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
