"""When a trajectory ends (EOS, stop tokens, stop strings, length) and its final text."""
from __future__ import annotations

from engine.sequence import Sequence


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
        if p.stop:
            # Decoding a short tail is enough: a stop string of L characters is at most 4L UTF-8
            # bytes, so at most 4L tokens even for byte-level tokenizers (an emoji can be 4 tokens).
            start = max(seq.num_prompt_tokens, seq.num_tokens - 4 * max(len(s) for s in p.stop) - 2)
            tail = self.tokenizer.decode(seq.token_ids[start:], skip_special_tokens=True)
            if any(s in tail for s in p.stop):
                return "stop"
        if seq.num_generated >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def final_text(self, seq: Sequence) -> str:
        if self.tokenizer is None:  # skip_tokenizer_init: token ids only
            return ""
        ids = seq.generated
        if seq.finish_reason == "stop" and ids and self._stopped_by_token(seq):
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in seq.params.stop if s in text]
        return text[:min(cuts)] if cuts else text
