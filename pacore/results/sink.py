"""Where a runner's output goes: into the files itself, or back to the driver of a data-parallel run.

A runner's journal (journal.py) produces five kinds of output (a results record, a round checkpoint,
a snapshot of a round in flight, the removal of that snapshot, a problem closed) and reads one (the
snapshot a round continues from). ``FileSink`` writes them beside the results file; ``EventSink`` queues them as
``(method, args)`` events that the driver replays on its own ``FileSink``, in order, so the driver
alone writes the files and a replica needs no shared filesystem.
"""
from __future__ import annotations

import os

from .files import ResultsWriter, rounds_path
from .snapshots import SnapshotStore

Event = tuple[str, tuple]  # a FileSink method name and its arguments


class FileSink:
    """The results file, its round checkpoints and its snapshot folder (files.py, snapshots.py)."""

    def __init__(self, out_path: str):
        self._results = ResultsWriter(os.path.realpath(out_path))  # --out may be a link; its side files not
        self._rounds = ResultsWriter(rounds_path(out_path))
        self._snapshots = SnapshotStore(out_path)

    def record(self, record: dict) -> None:
        self._results.write(record)

    def checkpoint(self, record: dict) -> None:
        self._rounds.write(record)

    def snapshot(self, record: dict) -> None:
        self._snapshots.write(record)

    def drop_snapshot(self, key: str, round_no: int) -> None:
        self._snapshots.drop(key, round_no)

    def load_snapshot(self, key: str, round_no: int) -> dict | None:
        return self._snapshots.read(key, round_no)

    def closed(self, problem_key: str) -> None:
        pass  # only a driver needs to know: the problem left its replica

    def close(self) -> None:
        self._results.close()
        self._rounds.close()
        self._snapshots.close()


class EventSink:
    """A replica's output, queued for the driver; snapshots to continue from arrive with the problem."""

    def __init__(self):
        self.events: list[Event] = []
        self.shipped: dict[tuple[str, int], dict] = {}  # (unit key, round) -> snapshot record

    def record(self, record: dict) -> None:
        self.events.append(("record", (record,)))

    def checkpoint(self, record: dict) -> None:
        self.events.append(("checkpoint", (record,)))

    def snapshot(self, record: dict) -> None:
        self.events.append(("snapshot", (record,)))

    def drop_snapshot(self, key: str, round_no: int) -> None:
        self.events.append(("drop_snapshot", (key, round_no)))

    def load_snapshot(self, key: str, round_no: int) -> dict | None:
        return self.shipped.pop((key, round_no), None)  # a round is added once: no need to keep it

    def closed(self, problem_key: str) -> None:
        self.events.append(("closed", (problem_key,)))

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events
