"""Snapshots of the rounds in flight, so that a kill costs minutes of decoding, not whole rounds.

One file per (problem, round) in ``OUT.partial/``: each trajectory's tokens so far and whether it
finished, and with ``--record-confidence`` its logprobs so far (``TokenLogprobs``: 172 bytes a position at
top 20, against 4 for its token), so that a resumed trajectory's earlier logprobs are the ones it had. It is rewritten atomically at every snapshot and deleted when the round ends; on
``--resume`` the round's request is re-added with it (``LLM.add_request(resume=...)``) and every
trajectory continues where it stopped, drawing the same tokens as if it never had. A replica of a
data-parallel run never writes these files: it sends the snapshot record to the driver
(results/sink.py), which writes it here and ships it back with the problem when the problem moves.
"""
from __future__ import annotations

import hashlib
import os
import sys
from array import array

from typing import TYPE_CHECKING

import torch

from engine.logprobs import TokenLogprobs

from .files import snapshot_dir
from .shapes import usable_snapshot_record

if TYPE_CHECKING:
    from engine.sequence import Partial  # one trajectory: its tokens so far, its finish reason


def snapshot_record(key: str, round_no: int, k: int, seed: int, prompt: list[int], partial: list[Partial],
                    logprobs: list[TokenLogprobs | None] | None = None) -> dict:
    """What a snapshot holds: the trajectories' tokens (and logprobs, when the round asked for them) and
    what they must match to be continued.

    Tokens are int32 arrays and logprobs TokenLogprobs (arrays too): compact, and plain to pickle between
    processes (a tensor sent through a multiprocessing pipe travels as a shared-memory handle that dies
    with its sender); both become tensors only on disk.
    """
    rec = {"key": key, "round": round_no, "k": k, "seed": seed, "prompt": _digest(prompt),
           "tokens": [array("i", t) for t, _ in partial], "finish_reasons": [reason for _, reason in partial]}
    if logprobs is not None and any(lp is not None for lp in logprobs):
        rec["logprobs"] = list(logprobs)
    return rec


def usable_snapshot(rec: dict | None, key: str, k: int, seed: int, prompt: list[int]) -> list[Partial] | None:
    """The trajectories of ``rec`` if it was taken with the same K, seed and prompt tokens, else None."""
    if rec is None or (rec.get("key"), rec.get("k"), rec.get("seed"), rec.get("prompt")) != (key, k, seed,
                                                                                           _digest(prompt)):
        return None
    return [(t.tolist(), reason) for t, reason in zip(rec["tokens"], rec["finish_reasons"])]


def snapshot_logprobs(rec: dict, num_top: int | None) -> list[TokenLogprobs | None] | None:
    """A usable snapshot's logprobs for a round asking ``num_top`` of them per position: per trajectory,
    those of all its tokens (None for one without, which the engine then recomputes); None when the
    round asks for none or the snapshot holds none (taken without --record-confidence)."""
    saved = rec.get("logprobs")
    if num_top is None or saved is None:
        return None
    fits = [lp if lp is not None and lp.num_top == num_top and len(lp) == len(tokens) else None
            for lp, tokens in zip(saved, rec["tokens"])]
    return fits if any(lp is not None for lp in fits) else None


class SnapshotStore:
    """The snapshot files of a results file, one per (unit, round), in ``OUT.partial/``."""

    def __init__(self, out_path: str):
        self.dir = snapshot_dir(out_path)

    def _path(self, key: str, round_no: int) -> str:
        return os.path.join(self.dir, f"{hashlib.sha1(key.encode()).hexdigest()[:24]}.r{round_no}.pt")

    def save(self, key: str, round_no: int, k: int, seed: int, prompt: list[int], partial: list[Partial],
             logprobs: list[TokenLogprobs | None] | None = None) -> None:
        self.write(snapshot_record(key, round_no, k, seed, prompt, partial, logprobs))

    def write(self, record: dict) -> None:
        os.makedirs(self.dir, exist_ok=True)
        path = self._path(record["key"], record["round"])
        # on disk as int32 tensors, which torch.load(weights_only=True) reads back
        tensors = [torch.frombuffer(t, dtype=torch.int32).clone() if len(t) else torch.zeros(0, dtype=torch.int32)
                   for t in record["tokens"]]
        saved = {**record, "tokens": tensors}
        if "logprobs" in record:
            saved["logprobs"] = [None if lp is None else lp.to_tensors() for lp in record["logprobs"]]
        try:
            with open(path + ".tmp", "wb") as f:
                torch.save(saved, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
        except BaseException:  # a full disk: leave no half-written file to fill it further
            try:
                os.remove(path + ".tmp")
            except FileNotFoundError:
                pass
            raise

    def read(self, key: str, round_no: int) -> dict | None:
        """The snapshot record of this round as saved, or None (none, or unreadable: the round starts over)."""
        path = self._path(key, round_no)
        if not os.path.exists(path):
            return None
        try:
            rec = torch.load(path, weights_only=True)
            why = usable_snapshot_record(rec)
            if why is None:
                rec = {**rec, "tokens": [array("i", t.to(torch.int32).numpy().tobytes()) for t in rec["tokens"]]}
                return _with_logprobs(rec, path)
        except Exception as e:  # torn, garbage, or tokens that are no tensors
            why = f"unreadable: {e}"
        print(f"pacore: the snapshot {path} cannot be used ({why}); its round starts over", file=sys.stderr)
        return None

    def load(self, key: str, round_no: int, k: int, seed: int, prompt: list[int]) -> list[Partial] | None:
        """The snapshot of this round, if one was taken with the same K, seed and prompt tokens."""
        return usable_snapshot(self.read(key, round_no), key, k, seed, prompt)

    def drop(self, key: str, round_no: int) -> None:
        try:
            os.remove(self._path(key, round_no))
        except FileNotFoundError:
            pass


def _with_logprobs(rec: dict, path: str) -> dict:
    """``rec`` with its saved logprobs read back; logprobs that cannot be are dropped (the tokens still
    resume, and the engine recomputes the logprobs from them)."""
    if "logprobs" not in rec:
        return rec
    try:
        return {**rec, "logprobs": [None if d is None else TokenLogprobs.from_tensors(d) for d in rec["logprobs"]]}
    except (ValueError, TypeError) as e:
        print(f"pacore: the logprobs in the snapshot {path} cannot be used ({e}); its trajectories resume "
              f"from their tokens and the engine recomputes them", file=sys.stderr)
        return {k: v for k, v in rec.items() if k != "logprobs"}


def _digest(tokens: list[int]) -> str:
    return hashlib.sha1(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes()).hexdigest()
