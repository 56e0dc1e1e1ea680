"""Streaming text of a growing token list: release only text that the final text will begin with."""
from __future__ import annotations


class IncrementalText:
    """Turns one trajectory's tokens into text deltas for a stream.

    Decoding is incremental (vLLM's offsets: each step decodes only the tokens since the last
    release, with the tokens before them as context), so a step costs O(new tokens), not O(text).
    Two things are held back until decided: text ending in an incomplete UTF-8 character ("\\ufffd",
    a byte-level token that needs the next one) and a tail that could be the start of a stop
    string. A stop string itself is never released: the engine cuts the final text before it.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.stop = stop
        self.text = ""     # decoded so far, settled characters only
        self.sent = 0      # characters of `text` released
        self._prefix = 0   # first token of the context window of the next decode
        self._read = 0     # tokens whose text is in `text`

    def feed(self, ids: list[int]) -> str:
        """ids: the trajectory's whole token list so far. Returns the text newly safe to send."""
        if len(ids) > self._read:
            decode = self.tokenizer.decode
            before = decode(ids[self._prefix:self._read], skip_special_tokens=True)
            after = decode(ids[self._prefix:], skip_special_tokens=True)
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self.text += after[len(before):]
                self._prefix, self._read = self._read, len(ids)
        end = len(self.text)
        for s in self.stop:
            found = self.text.find(s, max(0, self.sent - len(s) + 1))
            if found != -1:
                end = min(end, found)
                continue
            for k in range(min(len(s) - 1, len(self.text) - self.sent), 0, -1):
                if self.text.endswith(s[:k]):  # may become a stop string with the next tokens
                    end = min(end, len(self.text) - k)
                    break
        if end <= self.sent:
            return ""
        delta, self.sent = self.text[self.sent:end], end
        return delta

    def rest(self, final_text: str) -> str:
        """What the stream still owes once the engine's final text is known (the sent text is its
        beginning: incremental decoding of a tokenizer's output is prefix-stable)."""
        return final_text[self.sent:]
