"""Per-round statistics of a problem: what one round cost and produced."""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field

# A round's speculative decoding counters (RoundStats, the summary's rounds: the keys of LLM.stats()).
SPEC_DECODE_COUNTS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                      "spec_decode_num_emitted_tokens")


def spec_decode_ratios(counts: dict) -> dict:
    """Acceptance rate (accepted / drafted tokens) and mean tokens per verify step (tokens the verified
    rows appended / their verify steps) of summed SPEC_DECODE_COUNTS; None where nothing was drafted."""
    drafts, drafted = counts["spec_decode_num_drafts"], counts["spec_decode_num_draft_tokens"]
    return {"spec_decode_acceptance_rate": counts["spec_decode_num_accepted_tokens"] / drafted if drafted else None,
            "spec_decode_mean_tokens_per_verify": counts["spec_decode_num_emitted_tokens"] / drafts if drafts else None}


@dataclass(slots=True)
class RoundStats:
    """What one round (one engine request with n=K) of one problem cost and produced."""

    round: int  # 1-based
    k: int
    prompt_tokens: int
    generated_tokens: int
    prefill_time_s: float  # first token - arrival: queueing + prefill
    decode_time_s: float  # finished - first token
    tokens_per_s: float  # generated tokens / (prefill + decode time) of this request
    prefix_cache_hit_tokens: int
    kv_blocks_saved_by_sharing: int
    references: int  # reference messages in this round's prompt
    dropped_messages: int  # previous-round messages dropped because they were empty
    truncated_messages: int  # references shortened to fit the context
    truncated_tokens: int = 0  # tokens those references lost
    pool: int | None = None  # a round 1 drawn from a pool of this many trajectories (runs.py)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    answers: list[str | None] = field(default_factory=list)
    accuracy: float | None = None  # mean correctness over the K trajectories
    # Each trajectory's correctness, in the recorded order (None: not gradable), with --record-confidence
    # only: the summary relates confidence to it (evaluate/confidence.py); otherwise not recorded at all.
    correct: list[bool | None] | None = None
    # With --speculative-config: this session's verify work on the round's request (engine/spec/, the
    # names of LLM.stats()); None without it, and then not recorded at all.
    spec_decode_num_drafts: int | None = None
    spec_decode_num_draft_tokens: int | None = None
    spec_decode_num_accepted_tokens: int | None = None
    spec_decode_num_emitted_tokens: int | None = None
    # When the round's request was in the engine, as wall-clock times (time.time(): comparable across
    # replicas and sessions), and the tokens it took over from an earlier session's snapshot: the
    # summary's per-round tok/s is the round's new tokens over the union of these intervals.
    started_at: float | None = None
    finished_at: float | None = None
    resumed_tokens: int = 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name in ("correct", *SPEC_DECODE_COUNTS, "started_at", "finished_at"):
            if d[name] is None:
                del d[name]  # a run without --record-confidence or speculation records what it always has
        if not d["resumed_tokens"]:
            del d["resumed_tokens"]
        return d


def round_stats_from_output(round_no: int, k: int, out, *, references: int, dropped: int, truncated: int,
                            truncated_tokens: int = 0, resumed: int = 0, speculative: bool = False) -> RoundStats:
    """RoundStats from an engine RequestOutput; ``resumed`` tokens came from an earlier session's snapshot
    (counted as generated, but not in this session's tokens/s). ``speculative``: the engine speculates,
    so the request's speculative decoding counters are recorded."""
    m = out.metrics
    generated = sum(len(c.token_ids) for c in out.outputs)
    first = m.first_token_time if m.first_token_time is not None else m.finished_time
    prefill = max(0.0, first - m.arrival_time)
    decode = max(0.0, m.finished_time - first)
    total = prefill + decode
    finished_at = time.time()  # the engine's clock may be a process's own (or virtual): only its durations
    return RoundStats(
        round=round_no,
        k=k,
        prompt_tokens=len(out.prompt_token_ids),
        generated_tokens=generated,
        prefill_time_s=round(prefill, 6),
        decode_time_s=round(decode, 6),
        tokens_per_s=round((generated - resumed) / total, 3) if total > 0 else 0.0,
        prefix_cache_hit_tokens=int(out.num_cached_tokens or 0),
        kv_blocks_saved_by_sharing=int(getattr(m, "kv_blocks_saved_by_sharing", 0) or 0),
        references=references,
        dropped_messages=dropped,
        truncated_messages=truncated,
        truncated_tokens=truncated_tokens,
        finish_reasons=dict(Counter(c.finish_reason for c in out.outputs)),
        started_at=round(finished_at - total, 3), finished_at=round(finished_at, 3), resumed_tokens=resumed,
        **({name: getattr(m, name) for name in SPEC_DECODE_COUNTS} if speculative else {}),
    )
