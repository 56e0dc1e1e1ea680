"""FairShare: how the scheduler keeps one heavy request from holding up the others.

First come, first served let one request take a whole step, step after step: a running prefill of a
long prompt took the whole token budget before anything waiting was looked at, and a request with
n = 24 on 8 seats took every seat until its last trajectory ended. Two limits, both work-conserving
(what the others leave goes back to the heavy request, so alone it runs as fast as before):

- **Step budget.** A prefill chunk takes at most ``prefill_chunk`` tokens (vLLM's
  ``long_prefill_token_threshold``) while the step is first shared out, running sequences first, then
  admissions; what is left of the budget then extends the capped chunks, in that order. So a short
  prompt that arrives behind a long one is prefilled in the next step, beside the long one's chunk.
- **Seats.** While another request waits for a seat, one request keeps at most ``seats`` of them
  (``max_num_seqs_per_request``): its newest decoding sequences above that are preempted (recomputed
  later; their prompt comes back from the prefix cache) so the newcomer runs now, and waiting
  sequences of requests below their share are admitted before those of a request at it.

A fork group is still admitted whole (all n seats at once, the prompt's blocks shared, decoded with
cascade attention): the seat limit takes members from a group only while it holds more than
``seats``, which at the defaults (256 seats, ``seats`` 240) a PaCoRe round of K <= 32 never does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from engine.core.sequence import Request, Sequence


@dataclass(slots=True, frozen=True)
class FairShare:
    """Each request's share of a step's token budget and of the seats (``resolve`` from the engine's
    options; ``fcfs()`` is no share at all)."""
    prefill_chunk: int  # most prefill tokens per sequence in the first share of a step; 0: no limit
    seats: int          # most seats one request keeps while another waits for a seat

    @classmethod
    def resolve(cls, max_num_seqs: int, max_num_batched_tokens: int, long_prefill_token_threshold: int | None = None,
                max_num_seqs_per_request: int | None = None) -> "FairShare":
        """The limits from the engine's options; None picks the default: a quarter of the step budget,
        and max_num_seqs less a sixteenth of it (at least one seat kept for a newcomer)."""
        chunk = max_num_batched_tokens // 4 if long_prefill_token_threshold is None else long_prefill_token_threshold
        seats = (max(1, max_num_seqs - max(1, max_num_seqs // 16)) if max_num_seqs_per_request is None
                 else min(max_num_seqs_per_request, max_num_seqs))
        return cls(chunk, seats)

    @classmethod
    def fcfs(cls, max_num_seqs: int) -> "FairShare":
        """No limit: first come, first served (the scheduler before these limits)."""
        return cls(0, max_num_seqs)

    def first_chunk(self, remaining: int, budget: int) -> int:
        """A prefill's chunk in the first share of the step's ``budget``."""
        return min(remaining, budget, self.prefill_chunk) if self.prefill_chunk else min(remaining, budget)

    def under_share(self, seq: Sequence, held: dict[Request, int]) -> bool:
        return held.get(seq.request, 0) < self.seats

    def admission_order(self, waiting: Iterable[Sequence], held: dict[Request, int]) -> list[Sequence]:
        """The waiting sequences in the order they are offered room: those of requests holding fewer
        than ``seats`` seats first, then the others (seats nobody else asks for go to whoever waits);
        first come, first served within each."""
        under, at = [], []
        for seq in waiting:
            (under if self.under_share(seq, held) else at).append(seq)
        return under + at

    def seats_to_free(self, newcomer: Sequence, need: int, free: int, running: list[Sequence],
                      held: dict[Request, int]) -> list[Sequence]:
        """Running sequences to preempt so that ``newcomer`` (needing ``need`` seats, ``free`` free) runs:
        the newest decoding ones of requests holding more than ``seats``, none below it; empty when
        that would not free enough (a preemption that admits nobody is only lost work)."""
        if free >= need or held.get(newcomer.request, 0) >= self.seats:
            return []
        over = {req: n - self.seats for req, n in held.items() if n > self.seats and req is not newcomer.request}
        victims = []
        for seq in reversed(running):
            if free + len(victims) >= need:
                break
            decoding = seq.num_generated and seq.num_tokens - seq.num_computed == 1
            if decoding and over.get(seq.request, 0) > 0:
                victims.append(seq)
                over[seq.request] -= 1
        return victims if free + len(victims) >= need else []
