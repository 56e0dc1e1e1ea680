"""PaCoRe (Parallel Coordinated Reasoning) on the PaCoRe Engine.

Round r samples K_r trajectories from one prompt (one engine request with n=K_r, prefilled once);
each trajectory is compacted to its conclusion; the next round's prompt is the problem plus those
conclusions as reference responses; a final K=1 round gives the answer.
"""
from .compaction import Compacted, compact
from .config import PRESETS, RunConfig, parse_rounds, round_schedule
from .evaluate.grading import answers_equal, extract_answer, majority_vote
from .prompts import CONTROLLER_TEMPLATE, render_controller_prompt


def __getattr__(name: str):
    # The runner needs the engine, hence torch; `pacore --help` and the CLI's checks must not.
    if name in ("PaCoReRunner", "run_pacore"):
        from . import runner
        return getattr(runner, name)
    raise AttributeError(f"module 'pacore' has no attribute {name!r}")

__all__ = [
    "CONTROLLER_TEMPLATE",
    "PRESETS",
    "Compacted",
    "PaCoReRunner",
    "RunConfig",
    "answers_equal",
    "compact",
    "extract_answer",
    "majority_vote",
    "parse_rounds",
    "render_controller_prompt",
    "round_schedule",
    "run_pacore",
]
