"""Run configuration: the round schedule (K vector), presets and sampling/IO options."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .evaluate.confidence import TOP_K

if TYPE_CHECKING:
    from engine.config import EngineConfig

# The paper's / official repo's settings (playground/example_batch_inference_pacore_low_1210.py).
PRESETS: dict[str, tuple[int, ...]] = {"low": (4,), "medium": (16,), "high": (32, 4)}

MessageCap = int | Literal["auto"] | None


def parse_rounds(spec: str) -> tuple[int, ...]:
    """Parse a comma-separated K vector such as ``"32,4"`` into ``(32, 4)``."""
    try:
        ks = tuple(int(part) for part in spec.split(","))  # an empty entry ("4,,1") is refused too
    except ValueError:
        raise ValueError(f"expected comma-separated positive integers such as 32,4, got {spec!r}") from None
    if any(k < 1 for k in ks):
        raise ValueError(f"{spec!r}: each K is a round's number of trajectories and must be at least 1; the "
                         f"final K=1 round is always appended, so the smallest schedule is 1 (then the final round)")
    return ks


def round_schedule(ks: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The full schedule: the given K vector with the final K=1 round appended.

    The final round is appended unconditionally, as the official implementation does
    (``num_responses_per_round + [1]``), so ``[4, 1]`` runs three rounds.
    """
    ks = tuple(int(k) for k in ks)
    if any(k < 1 for k in ks):
        raise ValueError(f"every K must be >= 1, got {list(ks)}")
    return ks + (1,)


@dataclass(slots=True)
class RunConfig:
    """Everything that decides what a PaCoRe run computes and where it writes."""

    data_path: str
    out_path: str
    rounds: tuple[int, ...] = PRESETS["low"]  # K vector WITHOUT the final K=1 round
    # Generation budget of each trajectory; "auto": the context minus the round's prompt (the paper's
    # setting: the reference pipeline generates until the 131,072-token context is full).
    max_tokens: int | Literal["auto"] = 512
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    resume: bool = False
    skip_failed: bool = False  # on resume, leave problems whose only records are errors (default: rerun them)
    # on resume, continue although settings that change results differ from those recorded (results/settings.py)
    override_settings: bool = False
    max_problems_in_flight: int = 64
    # "auto": shorten references (keeping their ends) just enough for the round prompt to fit (with
    # max_tokens "auto": to leave a quarter of the context to generate, budget.reserved_room);
    # an int: cap every reference at that many tokens (then still error if it does not fit);
    # None: never shorten.
    message_token_cap: MessageCap = "auto"
    # Order of a round's responses, as recorded and as the next round's references (prompts.py):
    # "official" (the reference pipeline's length sort + fixed shuffle) or "seeded" (per problem and round).
    shuffle: str = "official"
    runs: int = 1  # independent runs of each problem (the paper averages pass@1 over 64 on AIME/HMMT/Apex)
    # Round-1 trajectories sampled once per problem; each run draws its K1 from them (None: no pool).
    pool: int | None = None
    grade: bool = True
    # Keep each trajectory's mean token logprob and DeepConf's lowest group confidence in its record
    # (evaluate/confidence.py); the engine then computes the top-20 logprobs of every sampled token.
    record_confidence: bool = False
    show_progress: bool = True
    # Where `pacore run --profile` writes the step timeline and traces (engine/profiler.py).
    profile_dir: str | None = None
    profile_trace_steps: int = 0  # with profile_dir: steps per round to trace with torch.profiler (--profile-traces)
    # Seconds between snapshots of the rounds in flight (results/snapshots.py); <= 0: only when stopped.
    checkpoint_every_s: float = 300.0
    # The engine's options: EngineConfig's keyword arguments (engine/config.py), "model" included, as
    # given (those left out are the engine's to choose). A plain dict, since it travels to replicas and
    # into the summary; ``engine`` is the typed, checked view every reader uses.
    engine_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        engine = self.engine  # unknown or bad engine options are refused here, before anything runs
        if self.record_confidence and engine.max_logprobs < TOP_K:
            raise ValueError(f"--record-confidence asks the engine for the top {TOP_K} logprobs of every token, "
                             f"but --max-logprobs is {engine.max_logprobs}; pass --max-logprobs {TOP_K} or more")

    @property
    def engine(self) -> EngineConfig:
        """The engine's configuration (checked by EngineConfig)."""
        from engine.config import EngineConfig  # torch-free, but `import pacore` must not load the engine

        unknown = sorted(set(self.engine_options) - set(EngineConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; the options are the fields of EngineConfig")
        return EngineConfig(**self.engine_options)

    @property
    def schedule(self) -> tuple[int, ...]:
        return round_schedule(self.rounds)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["rounds"] = list(self.rounds)
        d["schedule"] = list(self.schedule)
        return d
