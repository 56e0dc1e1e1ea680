"""When a trajectory ends (EOS, stop tokens, stop strings, length) and its final text."""
from __future__ import annotations

from engine.core.sequence import Sequence
from engine.sample.stop_strings import StopStrings


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
        # Before min_tokens nothing but the length ends it: its stop tokens cannot be drawn then
        # (engine/sample/penalties.py), and a stop string is not looked for, as vLLM.
        if seq.num_generated >= p.min_tokens:
            if self._stopped_by_token(seq):
                last = seq.token_ids[-1]  # vLLM's stop_reason: None for EOS, else the stop token
                seq.stop_reason = None if not p.ignore_eos and last in self.eos else last
                return "stop"
            if p.stop:
                seq.stop_reason = self._stop_string_ending_here(seq, p.stop_strings)
                if seq.stop_reason is not None:
                    return "stop"
        if seq.num_generated >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _stop_string_ending_here(self, seq: Sequence, stops: StopStrings) -> str | None:
        """The stop string that ends in the new token's text, if one does. Its cost follows the longest stop
        string, not how many there are: a short tail is decoded and only its end is searched."""
        # A stop string of L characters is at most 4L UTF-8 bytes, so at most 4L tokens even for
        # byte-level tokenizers (an emoji can be 4 tokens).
        ids = seq.token_ids
        lo = max(seq.num_prompt_tokens, len(ids) - 4 * stops.longest - 2)
        tail = self.tokenizer.decode(ids[lo:], skip_special_tokens=seq.params.skip_special_tokens)
        # Only one that ends in the new token's text: one that ended before did not stop the
        # trajectory because min_tokens was not reached yet, so it is text (vLLM).
        before = self._text_len(ids[lo:-1], seq.params)
        first, _ = stops.scan(tail, max(0, before - stops.longest + 1), before)
        return None if first == -1 else tail[first:first + _stop_at(seq.params.stop, tail, first)]

    def _text_len(self, ids: list[int], p) -> int:
        """The length of the text of ``ids`` that later tokens cannot change: without the replacement
        characters of a UTF-8 character that the next token completes."""
        return len(self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens).rstrip("\ufffd"))

    def final_text(self, seq: Sequence) -> str:
        if self.tokenizer is None:  # skip_tokenizer_init: token ids only
            return ""
        ids, p = seq.generated, seq.params
        if seq.finish_reason == "stop" and ids and self._stopped_by_token(seq) and not p.include_stop_str_in_output:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
        if not p.stop:
            return text
        # The first stop string that ends in the text of token min_tokens or later ended it: before, none
        # is looked for, so an earlier one stays in the text.
        early = self._text_len(ids[:p.min_tokens - 1], p) if p.min_tokens > 1 else 0
        first, _ = p.stop_strings.scan(text, max(0, early - p.stop_strings.longest + 1), early)
        if first == -1:
            return text
        return text[:first + _stop_at(p.stop, text, first)] if p.include_stop_str_in_output else text[:first]


def _stop_at(stop: list[str], text: str, first: int) -> int:
    """The length of the stop string that begins at ``text[first]`` (the shortest that matches there)."""
    return min(len(s) for s in stop if text.startswith(s, first))
