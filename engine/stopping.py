"""When a trajectory ends (EOS, stop tokens, stop strings, length) and its final text."""
from __future__ import annotations

from engine.sequence import Sequence
from engine.stop_strings import StopStrings


class StopChecker:
    def __init__(self, tokenizer, eos_token_ids: list[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos = set(eos_token_ids)
        self.max_model_len = max_model_len

    def _stopped_by_token(self, seq: Sequence) -> bool:
        p, last = seq.params, seq.token_ids[-1]
        return (not p.ignore_eos and last in self.eos) or last in p.stop_token_ids

    def check(self, seq: Sequence) -> str | None:
        """Called after each new token; returns "stop", "length" or None."""
        p = seq.params
        if self._stopped_by_token(seq):
            return "stop"
        if p.stop and self._stop_string_ends_here(seq, p.stop_strings):
            return "stop"
        if seq.num_generated >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _stop_string_ends_here(self, seq: Sequence, stops: StopStrings) -> bool:
        """Whether a stop string ends in the new token's text. Its cost follows the longest stop
        string, not how many there are: a short tail is decoded and only its end is searched."""
        # A stop string of L characters is at most 4L UTF-8 bytes, so at most 4L tokens even for
        # byte-level tokenizers (an emoji can be 4 tokens).
        ids = seq.token_ids
        tail = self.tokenizer.decode(ids[max(seq.num_prompt_tokens, len(ids) - 4 * stops.longest - 2):],
                                     skip_special_tokens=True)
        # One ending in the new text starts at most L - 1 characters before it; the token's text
        # alone may differ from its text here by a leading space or a partial character (+2).
        new = len(self.tokenizer.decode(ids[-1:], skip_special_tokens=True)) + 2
        first, _ = stops.scan(tail, max(0, len(tail) - new - stops.longest))
        return first != -1

    def final_text(self, seq: Sequence) -> str:
        if self.tokenizer is None:  # skip_tokenizer_init: token ids only
            return ""
        ids = seq.generated
        if seq.finish_reason == "stop" and ids and self._stopped_by_token(seq):
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if not seq.params.stop:
            return text
        first, _ = seq.params.stop_strings.scan(text)
        return text if first == -1 else text[:first]
