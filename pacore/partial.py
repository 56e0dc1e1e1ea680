"""Snapshots of the rounds in flight, so that a kill costs minutes of decoding, not whole rounds.

One file per (problem, round) in ``OUT.partial/``: each trajectory's tokens so far and whether it
finished. It is rewritten atomically at every snapshot and deleted when the round ends; on
``--resume`` the round's request is re-added with it (``LLM.add_request(resume=...)``) and every
trajectory continues where it stopped, drawing the same tokens as if it never had.
"""
from __future__ import annotations

import hashlib
import os

import torch

from .io import partial_dir


class PartialStore:
    def __init__(self, out_path: str):
        self.dir = partial_dir(out_path)

    def _path(self, key: str, round_no: int) -> str:
        return os.path.join(self.dir, f"{hashlib.sha1(key.encode()).hexdigest()[:24]}.r{round_no}.pt")

    def save(self, key: str, round_no: int, k: int, seed: int, prompt: list[int],
             partial: list[tuple[list[int], str | None]]) -> None:
        os.makedirs(self.dir, exist_ok=True)
        record = {"key": key, "round": round_no, "k": k, "seed": seed, "prompt": _digest(prompt),
                  "tokens": [torch.tensor(t, dtype=torch.int32) for t, _ in partial],
                  "finish_reasons": [reason for _, reason in partial]}
        path = self._path(key, round_no)
        with open(path + ".tmp", "wb") as f:
            torch.save(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    def load(self, key: str, round_no: int, k: int, seed: int,
             prompt: list[int]) -> list[tuple[list[int], str | None]] | None:
        """The snapshot of this round, if one was taken with the same K, seed and prompt tokens."""
        path = self._path(key, round_no)
        if not os.path.exists(path):
            return None
        try:
            rec = torch.load(path, weights_only=True)
        except Exception:  # unreadable: the round starts over
            return None
        if (rec.get("key"), rec.get("k"), rec.get("seed"), rec.get("prompt")) != (key, k, seed, _digest(prompt)):
            return None
        return [(t.tolist(), reason) for t, reason in zip(rec["tokens"], rec["finish_reasons"])]

    def drop(self, key: str, round_no: int) -> None:
        try:
            os.remove(self._path(key, round_no))
        except FileNotFoundError:
            pass


def _digest(tokens: list[int]) -> str:
    return hashlib.sha1(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes()).hexdigest()
