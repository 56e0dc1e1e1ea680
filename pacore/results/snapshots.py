"""Snapshots of the rounds in flight, so that a kill costs minutes of decoding, not whole rounds.

One file per (problem, round) in ``OUT.partial/``: each trajectory's tokens so far and whether it
finished, and with ``--record-confidence`` its logprobs so far (``TokenLogprobs``: 172 bytes a position
at top 20, against 4 for its token), so that a resumed trajectory's earlier logprobs are the ones it
had. It is rewritten atomically at every snapshot and deleted when the round ends (the folder too, once
empty, when the run ends); on ``--resume`` the round's request is re-added with it
(``LLM.add_request(resume=...)``) and every trajectory continues where it stopped, drawing the same
tokens as if it never had. What is read back is checked first: its shape, and logprobs that are
log-probabilities. A replica of a data-parallel run never writes these files: it sends the snapshot
record to the driver (results/sink.py), which writes it here and ships it back with the problem when
the problem moves.
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
import sys
from array import array

from typing import TYPE_CHECKING

import torch

from engine.sample.logprobs import TokenLogprobs

from .files import WriteFailed, replace_atomically, snapshot_dir, write_all
from .shapes import usable_snapshot_record

if TYPE_CHECKING:
    from engine.core.sequence import Partial  # one trajectory: its tokens so far, its finish reason


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
    fits = [lp if lp is not None and lp.num_top == num_top and lp.token_ids == list(tokens) else None
            for lp, tokens in zip(saved, rec["tokens"])]
    return fits if any(lp is not None for lp in fits) else None


def finished_without_logprobs(partial: list[Partial], logprobs: list[TokenLogprobs | None] | None) -> int | None:
    """The first trajectory of a snapshot that had finished but has no logprobs to go with it (None: none).
    A round that asks for logprobs cannot continue such a snapshot: the engine recomputes the logprobs
    of a trajectory only as it runs on, and a finished one never does."""
    for i, (tokens, reason) in enumerate(partial):
        if reason is not None and tokens and (logprobs is None or logprobs[i] is None):
            return i
    return None


# A snapshot's name (the unit's hash, the round), or the temporary file of one a kill left half-written
_OURS = re.compile(r"([0-9a-f]{24})\.r([0-9]+)\.pt(\.[0-9a-f]{16}\.tmp)?")


class SnapshotStore:
    """The snapshot files of a results file, one per (unit, round), in ``OUT.partial/``.

    Every access goes through the folder opened without following a link (``O_NOFOLLOW``), and a file
    in it is never read or written through a link: a snapshot is written to a new temporary file of an
    unpredictable name (``O_EXCL``) and renamed over the last one.
    """

    def __init__(self, out_path: str):
        self.dir = snapshot_dir(out_path)

    def _name(self, key: str, round_no: int) -> str:
        return f"{hashlib.sha1(key.encode()).hexdigest()[:24]}.r{round_no}.pt"

    def _path(self, key: str, round_no: int) -> str:
        return os.path.join(self.dir, self._name(key, round_no))

    def _open_dir(self, create: bool) -> int | None:
        """The folder's descriptor (None: there is none and ``create`` is False)."""
        if create:
            try:
                os.mkdir(self.dir)
            except FileExistsError:
                pass
            except OSError as e:
                raise WriteFailed(self.dir, e) from None
        try:
            return os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ENOENT and not create:
                return None
            why = "a symbolic link; pacore never writes through one" if os.path.islink(self.dir) else e.strerror
            raise WriteFailed(self.dir, OSError(e.errno, why)) from None

    def save(self, key: str, round_no: int, k: int, seed: int, prompt: list[int], partial: list[Partial],
             logprobs: list[TokenLogprobs | None] | None = None) -> None:
        self.write(snapshot_record(key, round_no, k, seed, prompt, partial, logprobs))

    def write(self, record: dict) -> None:
        """Save ``record`` atomically; WriteFailed (an OSError saying why in one sentence, never torch's
        internals) when it cannot be, with no file left behind."""
        # on disk as int32 tensors, which torch.load(weights_only=True) reads back
        tensors = [torch.frombuffer(t, dtype=torch.int32).clone() if len(t) else torch.zeros(0, dtype=torch.int32)
                   for t in record["tokens"]]
        saved = {**record, "tokens": tensors}
        if "logprobs" in record:
            saved["logprobs"] = [None if lp is None else lp.to_tensors() for lp in record["logprobs"]]
        name = self._name(record["key"], record["round"])
        path = os.path.join(self.dir, name)
        dir_fd = self._open_dir(create=True)
        try:
            replace_atomically(name, lambda fd: _save(saved, fd, path), dir_fd=dir_fd, shown=path)
        finally:
            os.close(dir_fd)

    def read(self, key: str, round_no: int) -> dict | None:
        """The snapshot record of this round as saved, or None (none, or unreadable: the round starts over)."""
        path = self._path(key, round_no)
        try:
            dir_fd = self._open_dir(create=False)
        except WriteFailed as e:  # the folder is a link (planted during the run): never read through it
            print(f"pacore: the snapshot {path} cannot be used ({e.strerror}); its round starts over", file=sys.stderr)
            return None
        if dir_fd is None:
            return None
        try:
            # O_NONBLOCK: a FIFO planted there is refused below, never waited on
            fd = os.open(self._name(key, round_no), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            why = "a symbolic link, never followed" if e.errno == errno.ELOOP else e.strerror
            fd = None
        finally:
            os.close(dir_fd)
        if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            fd, why = None, "not a regular file"
        if fd is not None:
            try:
                with open(fd, "rb") as f:
                    rec = torch.load(f, weights_only=True)
                why = usable_snapshot_record(rec)
                if why is None:
                    rec = {**rec, "tokens": [array("i", t.to(torch.int32).numpy().tobytes()) for t in rec["tokens"]]}
                    return _with_logprobs(rec, path)
            except Exception:  # torn, garbage, or tokens that are no tensors; torch's own words help no one
                why = "unreadable: torn, or not a snapshot file"
        print(f"pacore: the snapshot {path} cannot be used ({why}); its round starts over", file=sys.stderr)
        return None

    def load(self, key: str, round_no: int, k: int, seed: int, prompt: list[int]) -> list[Partial] | None:
        """The snapshot of this round, if one was taken with the same K, seed and prompt tokens."""
        return usable_snapshot(self.read(key, round_no), key, k, seed, prompt)

    def _existing_dir(self) -> int | None:
        """The folder's fd for removing in it, or None: none there, or a link (nothing of ours behind it)."""
        try:
            return self._open_dir(create=False)
        except WriteFailed:
            return None

    def drop(self, key: str, round_no: int) -> None:
        dir_fd = self._existing_dir()
        if dir_fd is None:
            return
        try:
            os.unlink(self._name(key, round_no), dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dir_fd)

    def prune(self, units: set[str], rounds: set[tuple[str, int]]) -> None:
        """Remove the snapshots of work since saved (every round of ``units``; the (unit, round) pairs of
        ``rounds``) and what a kill left half-written (the temporary files of replace_atomically), then
        the folder once empty. Called with the results lock held: no run writes here meanwhile."""
        stale = {self._name(key, r) for key, r in rounds}
        hashes = {self._name(key, 0).split(".")[0] for key in units}
        dir_fd = self._existing_dir()
        if dir_fd is None:
            return
        try:
            for name in os.listdir(dir_fd):
                ours = _OURS.fullmatch(name)
                if not ours or not (ours[3] or ours[1] in hashes or f"{ours[1]}.r{ours[2]}.pt" in stale):
                    continue
                try:
                    if stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):  # never a link
                        os.unlink(name, dir_fd=dir_fd)
                except OSError:
                    pass
        finally:
            os.close(dir_fd)
        self.close()

    def close(self) -> None:
        """Remove the folder if it is empty (every round in flight ended): a finished run leaves none."""
        try:
            os.rmdir(self.dir)
        except OSError:  # holds snapshots, or is none, or a link (rmdir never follows one)
            pass


class _FdWriter(io.RawIOBase):
    """What torch.save writes to: the bytes go to ``fd`` here, so that an error (a full disk) is an
    OSError of ours instead of torch's ``PytorchStreamWriter failed writing file``."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path, self.error = fd, path, None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            write_all(self.fd, bytes(data), self.path)
        except WriteFailed as e:
            self.error = e
            raise
        return len(data)


def _save(saved: dict, fd: int, path: str) -> None:
    writer = _FdWriter(fd, path)
    try:
        torch.save(saved, writer)
    except Exception:
        if writer.error is not None:
            raise writer.error from None
        raise


def _with_logprobs(rec: dict, path: str) -> dict:
    """``rec`` with its saved logprobs read back; logprobs that cannot be are dropped (the tokens still
    resume; the engine recomputes the logprobs of unfinished trajectories, and a finished one's round
    starts over)."""
    if "logprobs" not in rec:
        return rec
    try:
        logprobs = [None if d is None else _checked(TokenLogprobs.from_tensors(d), d) for d in rec["logprobs"]]
    except (ValueError, TypeError) as e:
        print(f"pacore: the logprobs in the snapshot {path} cannot be used ({e}); its trajectories resume "
              f"from their tokens, the engine recomputes the logprobs of those that run on, and a round with a "
              f"finished one starts over", file=sys.stderr)
        return {k: v for k, v in rec.items() if k != "logprobs"}
    return {**rec, "logprobs": logprobs}


def _checked(lp: TokenLogprobs, saved: dict) -> TokenLogprobs:
    """``lp`` if its logprobs are log-probabilities: the sampled tokens' finite and at most 0, the top
    ones at most 0 (-inf: a token the sampler filtered out); else ValueError, as for bad ids or lengths."""
    chosen, top = saved["logprobs"].double(), saved["top_logprobs"].double()
    if not bool(torch.isfinite(chosen).all()) or bool((chosen > 0).any()):
        raise ValueError("sampled-token logprobs that are not finite or above 0")
    if bool(torch.isnan(top).any()) or bool((top > 0).any()):
        raise ValueError("top logprobs that are NaN or above 0")
    return lp


def _digest(tokens: list[int]) -> str:
    return hashlib.sha1(torch.tensor(tokens, dtype=torch.int64).numpy().tobytes()).hexdigest()
