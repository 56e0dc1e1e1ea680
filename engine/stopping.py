"""When a trajectory ends (EOS, stop tokens, stop strings, length) and its final text."""
from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


class StopStrings:
    """A request's stop strings as one Aho-Corasick automaton: searching a text costs what the text
    costs, however many strings there are. Built once per request (``SamplingParams.stop_strings``),
    in time and memory proportional to the strings' characters.

    A state is a prefix of some stop string; ``_match[state]`` is the length of the longest stop
    string that ends there (0: none), and the state's depth is the longest suffix of the text read so
    far that may still grow into a stop string.
    """

    __slots__ = ("longest", "_goto", "_fail", "_depth", "_match")

    def __init__(self, stop: list[str]):
        self.longest = max(map(len, stop), default=0)
        goto: list[dict[str, int]] = [{}]
        depth, match = [0], [0]
        for s in stop:
            state = 0
            for ch in s:
                nxt = goto[state].get(ch)
                if nxt is None:
                    nxt = goto[state][ch] = len(goto)
                    goto.append({})
                    depth.append(depth[state] + 1)
                    match.append(0)
                state = nxt
            match[state] = len(s)
        fail = [0] * len(goto)
        queue = deque(goto[0].values())  # breadth first: a state's fallback is shallower, so already set
        while queue:
            state = queue.popleft()
            for ch, nxt in goto[state].items():
                f = fail[state]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[nxt] = goto[f].get(ch, 0)
                match[nxt] = max(match[nxt], match[fail[nxt]])
                queue.append(nxt)
        self._goto, self._fail, self._depth, self._match = goto, fail, depth, match

    def scan(self, text: str, start: int = 0) -> tuple[int, int]:
        """Read ``text[start:]``: (where the first stop string in it begins, -1 if none; how many of
        its last characters may begin a stop string that the text to come completes)."""
        if not self.longest:
            return -1, 0
        goto, fail, match = self._goto, self._fail, self._match
        state, first = 0, -1
        for i in range(start, len(text)):
            ch = text[i]
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            if match[state] and (first == -1 or i + 1 - match[state] < first):
                first = i + 1 - match[state]
        return first, self._depth[state]


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
