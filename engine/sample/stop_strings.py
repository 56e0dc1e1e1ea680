"""A request's stop strings, indexed: where the first one begins in a text, and how much of the
text's end may still grow into one, at a cost that follows the text, not the number of strings."""
from __future__ import annotations

from collections import deque


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

    def scan(self, text: str, start: int = 0, after: int = 0) -> tuple[int, int]:
        """Read ``text[start:]``: (where the first stop string in it that ends past ``text[:after]``
        begins, -1 if none; how many of its last characters may begin a stop string that the text to
        come completes)."""
        if not self.longest:
            return -1, 0
        goto, fail, match = self._goto, self._fail, self._match
        state, first = 0, -1
        for i in range(start, len(text)):
            ch = text[i]
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            if match[state] and i >= after and (first == -1 or i + 1 - match[state] < first):
                first = i + 1 - match[state]
        return first, self._depth[state]
