"""Streaming text of a growing token list: release only text that the final text will begin with."""
from __future__ import annotations

from engine.sample.stop_strings import StopStrings


class IncrementalText:
    """Turns one trajectory's new tokens into text deltas for a stream.

    Decoding is incremental (vLLM's offsets: each call decodes only the tokens since the last
    release, with the tokens before them as context), so a step costs O(new tokens), not O(text).
    Two things are held back until decided: text ending in an incomplete UTF-8 character ("\\ufffd",
    a byte-level token that needs the next one) and a tail that could be the start of a stop
    string. A stop string itself is never released: the engine cuts the final text before it.
    Since a held tail is the longest one that could start a stop string, no stop string can begin in
    released text, so only the unreleased text is searched, once per call whatever the number of
    stop strings (``stop``: the request's, indexed: SamplingParams.stop_strings).
    """

    def __init__(self, tokenizer, stop: StopStrings, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = stop
        self.skip_special_tokens = skip_special_tokens  # the request's, as the engine's final text
        self.seen = 0        # tokens fed so far
        self.sent = 0        # characters released so far
        self._pending = ""   # decoded, not released yet
        self._ids: list[int] = []  # tokens from the decode window's start on
        self._read = 0       # of _ids, those whose text is decoded

    def feed(self, new_ids: list[int]) -> str:
        """new_ids: the trajectory's tokens since the last call. Returns the text newly safe to send."""
        self.seen += len(new_ids)
        if self.tokenizer is None:  # a server without one: the engine's text is "" (token ids only)
            return ""
        self._ids.extend(new_ids)
        if len(self._ids) > self._read:
            decode = self.tokenizer.decode
            skip = self.skip_special_tokens
            before = decode(self._ids[:self._read], skip_special_tokens=skip)
            after = decode(self._ids, skip_special_tokens=skip)
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self._pending += after[len(before):]
                # The tokens just decoded are the next window's context.
                self._ids = self._ids[self._read:]
                self._read = len(self._ids)
        text = self._pending
        first, held = self.stop.scan(text)  # held: a tail that may become a stop string with the next tokens
        end = len(text) - held if first == -1 else min(first, len(text) - held)
        delta, self._pending = text[:end], text[end:]
        self.sent += len(delta)
        return delta

    def rest(self, final_text: str) -> str:
        """What the stream still owes once the engine's final text is known (the sent text is its
        beginning: incremental decoding of a tokenizer's output is prefix-stable)."""
        return final_text[self.sent:]
