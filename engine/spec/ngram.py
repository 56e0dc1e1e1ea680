"""N-gram drafts from PaCoRe's own corpus: the prompt, the row's tokens, and its sibling trajectories.

A request's index maps each ``n``-gram (n = prompt_lookup_min) of its corpus to the few most recent
places it occurred, a place being where the tokens that followed it start. A row looks up its last n
tokens, extends each candidate match backwards (up to prompt_lookup_max tokens), and takes the longest
one's continuation as its draft (ties: its own tokens, then the most recent). Indexing is incremental:
each source is indexed up to the tokens it has, caught up when its row drafts, so a step's host work
grows with the rows and their new tokens, never with the context.

Keys are Python hashes of token tuples: a collision could only give a bad draft, which verification
rejects (speed, never correctness); candidates are compared token by token anyway.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sequence import Request, Sequence

PROMPT = -1  # the source id of the request's prompt; a child's is its index
_RECENT = 4  # places kept per n-gram: enough to prefer a longer match, bounded memory per token


@dataclass(slots=True)
class NgramIndex:
    """One request's corpus. ``sources``: source id -> its tokens (the prompt, or a child's token list,
    prompt included, the live Sequence's own list); ``indexed``: the next position to index in each.
    ``shared``: children's n-grams go into one table with the prompt's (siblings draft from each other);
    otherwise each child's go into its own namespace, next to the prompt's."""

    n: int
    shared: bool = True
    places: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # key -> [(source, continuation)]
    sources: dict[int, list[int]] = field(default_factory=dict)
    indexed: dict[int, int] = field(default_factory=dict)

    def _key(self, source: int, gram: list[int]) -> int:
        return hash(tuple(gram)) if self.shared or source == PROMPT else hash((source, *gram))

    def add_source(self, source: int, tokens: list[int], start: int) -> None:
        """Index ``tokens`` (a list that may grow) from continuation position ``start`` on."""
        self.sources[source] = tokens
        self.indexed[source] = max(start, self.n)

    def catch_up(self, source: int) -> None:
        """Index every continuation position of ``source`` up to its last token."""
        tokens, n, places = self.sources[source], self.n, self.places
        for p in range(self.indexed[source], len(tokens)):
            key = self._key(source, tokens[p - n:p])
            seen = places.get(key)
            if seen is None:
                places[key] = [(source, p)]
            else:
                seen.append((source, p))
                if len(seen) > _RECENT:
                    del seen[0]
        self.indexed[source] = max(self.indexed[source], len(tokens))

    def lookup(self, own: int, k: int, max_match: int) -> tuple[list[int], int]:
        """(draft of up to k tokens, the source it came from) for source ``own``'s next positions; ([], own)
        when its last n tokens occur nowhere with a continuation."""
        tokens, n = self.sources[own], self.n
        L = len(tokens)
        if L < n:
            return [], own
        gram = tokens[L - n:]
        seen = self.places.get(self._key(own, gram), [])
        if not self.shared:
            seen = seen + self.places.get(self._key(PROMPT, gram), [])
        best, best_len = None, -1
        for source, p in reversed(seen):  # most recent first
            src = self.sources[source]
            if src[p - n:p] != gram:
                continue  # a hash collision
            m = n
            while m < max_match and p - m > 0 and L - m > 0 and src[p - m - 1] == tokens[L - m - 1]:
                m += 1
            if m > best_len or (m == best_len and source == own and best[0] != own):
                best, best_len = (source, p), m
                if m == max_match and source == own:
                    break  # no older place can beat it: none is longer, and its own tokens win ties
        if best is None:
            return [], own
        source, p = best
        # Every child's tokens start with the prompt: a match in the prompt continues in the row's own
        # tokens, past the prompt's end.
        return (tokens if source == PROMPT else self.sources[source])[p:p + k], source


class NgramDrafter:
    """Drafts for decode rows from their request's NgramIndex (kept on the Request: it lives and dies
    with the request)."""

    def __init__(self, min_n: int, max_n: int, siblings: bool):
        self.min_n, self.max_n, self.siblings = min_n, max_n, siblings

    def index_of(self, req: Request) -> NgramIndex:
        index = req.draft_index
        if index is None:
            index = req.draft_index = NgramIndex(self.min_n, self.siblings)
            index.add_source(PROMPT, req.prompt_token_ids, 0)
            index.catch_up(PROMPT)
        return index

    def propose(self, seq: Sequence, k: int) -> tuple[list[int], str]:
        """Up to k draft tokens for ``seq``'s next positions, and the corpus they came from ("prompt",
        "own" or "sibling"; "" without a draft)."""
        index = self.index_of(seq.request)
        if index.sources.get(seq.index) is not seq.token_ids:  # new, or a child resumed into a new list
            index.add_source(seq.index, seq.token_ids, seq.num_prompt_tokens)
        index.catch_up(seq.index)
        draft, source = index.lookup(seq.index, k, self.max_n)
        if not draft:
            return [], ""
        return draft, "prompt" if source == PROMPT else ("own" if source == seq.index else "sibling")
