"""Log-probabilities of tokens: computed for the rows that ask (SamplingParams.logprobs and
prompt_logprobs), kept flat, handed out in vLLM's shape (a dict of Logprob per position).

Which distribution: ``raw_logprobs`` (vLLM's default) is the log-softmax of the model's logits, before
temperature and filters; ``processed_logprobs`` is the distribution a token was actually drawn from
(temperature, top-k, top-p, min-p applied; filtered tokens are -inf). Prompt logprobs are raw: no
sampling happens at a prompt position.

At PaCoRe's shape a trajectory has 50k+ positions; a Python dict of Logprob objects per position costs
~2.3 KB at top 20 (tracemalloc; docs/engine-api.md), against 172 bytes here, so positions live in flat arrays
(4-byte values) and a position's dict is built when it is read.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Callable, Iterator

import torch


@dataclass(slots=True)
class Logprob:
    """One token's log-probability at a position and its rank there (1 = the most likely)."""
    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass(slots=True)
class LogprobRows:
    """What one batch of rows computed, on the host: per row the chosen token's logprob and rank,
    and the top ``num_top`` (token id, logprob) pairs."""
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]

    @classmethod
    def concat(cls, parts: list["LogprobRows"]) -> "LogprobRows":
        return cls(*(sum((getattr(p, f) for p in parts), []) for f in cls.__slots__))


def compute_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> LogprobRows:
    """Reduce normalised log-probabilities ``[M, V]`` (fp32) to the chosen tokens' logprob and rank
    and the top ``num_top`` alternatives per row. One pass per row: rows never mix (batch-invariant)."""
    if logprobs.dim() != 2 or token_ids.shape != (logprobs.shape[0],):
        raise ValueError(f"compute_logprobs wants [M, V] logprobs and [M] token ids, got {tuple(logprobs.shape)} "
                         f"and {tuple(token_ids.shape)}")
    token_ids = token_ids.to(logprobs.device, torch.long)
    chosen = logprobs.gather(1, token_ids[:, None])
    # rank = 1 + how many tokens are strictly more likely (ties share the better rank, as vLLM)
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    if num_top > 0:
        top_lp, top_ids = logprobs.topk(num_top, dim=-1)
        top_ids_l, top_lp_l = top_ids.tolist(), top_lp.tolist()
    else:
        top_ids_l = top_lp_l = [[] for _ in range(logprobs.shape[0])]
    return LogprobRows(token_ids.tolist(), chosen.squeeze(1).tolist(), ranks.tolist(), top_ids_l, top_lp_l)


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """The model's distribution: log-softmax of fp32 logits, per row."""
    return torch.log_softmax(logits.float(), dim=-1)


class TokenLogprobs:
    """Per position: the chosen token, its logprob and rank, and the top ``num_top`` alternatives.

    Reads like vLLM's list of dicts: ``len(x)``, ``x[i]`` is ``{token_id: Logprob}`` with the chosen
    token first and then the top-N in rank order (N entries when the chosen token is among them, else
    N + 1), ``x[a:b]`` is a TokenLogprobs, and iteration gives the dicts. ``decode`` (a token id ->
    text function, the LLM's tokenizer) fills ``decoded_token``; it is not pickled.
    """

    __slots__ = ("num_top", "_ids", "_lp", "_ranks", "_top_ids", "_top_lp", "decode")

    def __init__(self, num_top: int, decode: Callable[[int], str] | None = None):
        self.num_top = num_top
        self._ids, self._ranks, self._top_ids = array("i"), array("i"), array("i")
        self._lp, self._top_lp = array("f"), array("f")
        self.decode = decode

    # -- building ----------------------------------------------------------------------------
    def append_row(self, rows: LogprobRows, i: int) -> None:
        """Add row ``i`` of a computed batch (its top list cut to this container's num_top)."""
        self._ids.append(rows.token_ids[i])
        self._lp.append(rows.logprobs[i])
        self._ranks.append(rows.ranks[i])
        if self.num_top:
            self._top_ids.extend(rows.top_ids[i][:self.num_top])
            self._top_lp.extend(rows.top_logprobs[i][:self.num_top])

    def extend(self, other: "TokenLogprobs") -> None:
        if other.num_top != self.num_top:
            raise ValueError(f"cannot join logprobs with top {other.num_top} to logprobs with top {self.num_top}")
        for mine, theirs in zip(self._arrays(), other._arrays()):
            mine.extend(theirs)

    def _arrays(self) -> tuple[array, ...]:
        return self._ids, self._lp, self._ranks, self._top_ids, self._top_lp

    # -- reading -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ids)

    @property
    def token_ids(self) -> list[int]:
        """The chosen token at each position."""
        return self._ids.tolist()

    @property
    def logprobs(self) -> list[float]:
        """The chosen token's logprob at each position."""
        return self._lp.tolist()

    @property
    def ranks(self) -> list[int]:
        return self._ranks.tolist()

    def top(self, i: int) -> list[tuple[int, float]]:
        """Position ``i``'s top-N (token id, logprob) pairs, most likely first."""
        i = range(len(self))[i]
        k = self.num_top
        return list(zip(self._top_ids[i * k:(i + 1) * k], self._top_lp[i * k:(i + 1) * k]))

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError("TokenLogprobs slices take a step of 1")
            out = TokenLogprobs(self.num_top, self.decode)
            k = self.num_top
            out._ids, out._lp, out._ranks = self._ids[start:stop], self._lp[start:stop], self._ranks[start:stop]
            out._top_ids, out._top_lp = self._top_ids[start * k:stop * k], self._top_lp[start * k:stop * k]
            return out
        i = range(len(self))[i]
        token = self._ids[i]
        entry = {token: Logprob(self._lp[i], self._ranks[i], self._text(token))}
        for rank, (tid, lp) in enumerate(self.top(i), start=1):
            if tid not in entry:
                entry[tid] = Logprob(lp, rank, self._text(tid))
        return entry

    def __iter__(self) -> Iterator[dict[int, Logprob]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        return (isinstance(other, TokenLogprobs) and self.num_top == other.num_top
                and self._arrays() == other._arrays())

    def __repr__(self) -> str:
        return f"TokenLogprobs({len(self)} positions, top {self.num_top})"

    def _text(self, token: int) -> str | None:
        return self.decode(token) if self.decode is not None else None

    @property
    def cumulative_logprob(self) -> float:
        return float(sum(self._lp))

    # -- pickling and saving -----------------------------------------------------------------
    def __getstate__(self):
        return self.num_top, self._arrays()

    def __setstate__(self, state) -> None:
        self.num_top, (self._ids, self._lp, self._ranks, self._top_ids, self._top_lp) = state
        self.decode = None

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The arrays as tensors, for torch.save (torch.load(weights_only=True) reads them back) and
        for vectorised reading: ``num_top`` (a scalar), ``token_ids``, ``logprobs`` and ``ranks`` ([N]),
        ``top_ids`` and ``top_logprobs`` ([N * num_top], row-major: position i's at i * num_top)."""
        out = {"num_top": torch.tensor(self.num_top)}
        for key, attr, _, dtype in _SAVED:
            a = getattr(self, attr)
            out[key] = torch.frombuffer(bytearray(a.tobytes()), dtype=dtype) if len(a) else torch.zeros(0, dtype=dtype)
        return out

    @classmethod
    def from_tensors(cls, d: dict[str, torch.Tensor]) -> "TokenLogprobs":
        """Read back what to_tensors wrote; ValueError names what does not fit."""
        try:
            out = cls(int(d["num_top"]))
            n, k = d["token_ids"].numel(), out.num_top
            if k < 0 or [d[key].numel() for key, *_ in _SAVED] != [n, n, n, n * k, n * k]:
                raise ValueError("array lengths do not match")
            for key, attr, code, dtype in _SAVED:
                a = array(code)
                a.frombytes(d[key].to(dtype).contiguous().numpy().tobytes())
                setattr(out, attr, a)
        except (KeyError, TypeError, AttributeError, RuntimeError) as e:
            raise ValueError(f"not saved TokenLogprobs ({type(e).__name__}: {e})") from None
        return out


# (saved key, TokenLogprobs array, array typecode, tensor dtype): to_tensors / from_tensors
_SAVED = (("token_ids", "_ids", "i", torch.int32), ("logprobs", "_lp", "f", torch.float32),
          ("ranks", "_ranks", "i", torch.int32), ("top_ids", "_top_ids", "i", torch.int32),
          ("top_logprobs", "_top_lp", "f", torch.float32))


def prompt_logprobs_list(store: TokenLogprobs) -> list[dict[int, Logprob] | None]:
    """vLLM's prompt_logprobs: None for the first prompt token, then one dict per later token."""
    return [None, *store]
