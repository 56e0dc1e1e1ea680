"""Chaos: a seeded ``pacore run`` stopped by SIGKILL and SIGTERM at random moments, resumed after each,
and its records compared with those of the same run never stopped.

    python -m bench.chaos --kills 6 --seed 0 --out runs/chaos -- python -m pacore run --data problems.jsonl \\
        --preset low --max-tokens 64 --seed 7 --batch-invariant --checkpoint-every 1

The command after ``--`` is run as given, with ``--out FILE`` added (and ``--resume`` from the second
session on; a resume may add one of ``--variant``'s flag sets, such as a speculative configuration). It
runs once whole (the reference), then session after session, each stopped after a seeded random delay
(up to the reference's wall time) by a seeded choice of SIGKILL or SIGTERM, until ``--kills`` signals
landed; a last session completes it. Then it checks what docs/guarantees.md promises:

- every SIGTERM exits 143 (or -15 with nothing said, before ``pacore run`` took the signal over), with the
  resume hint, "complete" or "nothing was saved" as its last line; no session prints a traceback;
- the results hold no torn line and no duplicate record, and no error record;
- the lock is released (no ``.lock`` file) and no snapshot folder is left;
- each record equals the reference's field by field, except the per-session fields (PER_SESSION).

The rehearsal runs it at PaCoRe-8B's shape (bench/rehearsal/chaos.py); tests/pacore/test_pacore_chaos.py
at a tiny model's.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# A round's fields that say how a session ran it, not what it computed (docs/guarantees.md, "Chaos"): its
# times, the prefix cache's and fork's savings, the tokens continued from a snapshot, and speculation's
# counters (a session's verify work). In rounds_stats and in a pool's stats.
PER_SESSION = ("prefill_time_s", "decode_time_s", "tokens_per_s", "started_at", "finished_at", "resumed_tokens",
               "prefix_cache_hit_tokens", "kv_blocks_saved_by_sharing", "spec_decode_num_drafts",
               "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "spec_decode_num_emitted_tokens")
HUNG = -9999  # the status of a session that outlived its timeout (killed)
ENDINGS = ("Run again with --resume to complete the rest.", "are complete", "nothing was saved")


@dataclass(slots=True)
class Session:
    """One session of the chaos run: the signal sent (None: ran to its end), when, and how it ended."""

    signal: str | None
    after_s: float | None
    status: int
    wall_s: float
    last_line: str
    variant: int
    when: str  # "loading" (before the engine was up) or "running"


@dataclass(slots=True)
class Report:
    sessions: list[Session] = field(default_factory=list)
    reference_s: float = 0.0
    records: int = 0
    recorded_between: int = 0  # records the interrupted sessions wrote (the last one wrote the others)
    from_snapshots: int = 0  # sessions that continued rounds in flight from snapshots
    compared_fields: int = 0
    problems: list[str] = field(default_factory=list)  # every broken promise, said

    @property
    def kills(self) -> int:
        return sum(s.signal is not None and s.status != 0 for s in self.sessions)

    def summary(self) -> str:
        sent = [s for s in self.sessions if s.signal is not None]
        by = {sig: sum(s.signal == sig for s in sent if s.status != 0) for sig in ("SIGKILL", "SIGTERM")}
        late = sum(s.status == 0 for s in sent)
        loading = sum(s.when == "loading" for s in sent if s.status != 0)
        head = (f"chaos: {self.kills} interruptions ({by['SIGKILL']} SIGKILL, {by['SIGTERM']} SIGTERM; {loading} while "
                f"the session started; {late} sent after the session had finished), {len(self.sessions)} sessions "
                f"({self.from_snapshots} continued rounds in flight from snapshots); "
                f"{self.records} records ({self.recorded_between} written between kills) compared with the "
                f"uninterrupted run ({self.compared_fields} fields), reference {self.reference_s:.1f} s")
        if not self.problems:
            return head + "; differences: none"
        return head + f"; {len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)


def run_chaos(command: list[str], folder: str | Path, kills: int, seed: int = 0,
              variants: list[list[str]] | None = None, env: dict | None = None, timeout_s: float = 600.0,
              max_sessions: int | None = None) -> Report:
    """Run ``command`` whole, then stopped ``kills`` times and resumed (module docstring); the report of
    what held. ``variants``: flag sets a resume picks from (seeded; [] is the plain run).

    The moments: a quarter of the signals land while the session starts (uniform over the reference's
    time to its ``engine:`` line: imports, the preflight, the model loading), the others once the engine
    is up, uniform over 1.5 times the reference's running time still to go (by the lines written, against
    the reference's) split by the kills still to land (3/4 of a share, on average, between two kills), so
    that most of the run is done between kills and they land before it is complete."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    variants = variants or [[]]
    report = Report()
    ref = folder / "reference.jsonl"
    out = folder / "chaos.jsonl"
    for p in folder.glob("*.jsonl*"):  # a rerun starts over
        _remove(p)
    status, err, loaded, wall = _session(command + ["--out", str(ref)], None, 0.0, False, env, timeout_s)
    report.reference_s = wall
    if status != 0:
        report.problems.append(f"the uninterrupted run exited {status}: {_tail(err)}")
        return report
    loading, running = loaded or wall, wall - (loaded or wall)
    limit = max_sessions or 4 * kills + 4
    while report.kills < kills and len(report.sessions) < limit:
        resume = bool(report.sessions)
        variant = rng.randrange(len(variants)) if resume else 0
        sig = rng.choice((signal.SIGKILL, signal.SIGTERM))
        early = rng.random() < 0.25
        left = running * max(0.05, 1 - _written(out) / max(1, _written(ref)))  # the reference's time still to go
        after = rng.uniform(0.0, loading if early else 1.5 * left / (kills - report.kills))
        argv = command + ["--out", str(out)] + (["--resume"] if resume else []) + variants[variant]
        status, err, _, wall = _session(argv, sig, after, not early, env, timeout_s)
        s = Session(sig.name, after, status, wall, _last(err), variant, "loading" if early else "running")
        report.sessions.append(s)
        report.from_snapshots += "continue from their snapshots" in err
        _check_session(report, s, err, out)
        if status == 0:  # it finished before the signal: nothing is left to stop
            break
    report.recorded_between = len(_records(out, Report(), "chaos"))
    status, err, _, wall = _session(command + ["--out", str(out), "--resume"], None, 0.0, False, env, timeout_s)
    report.sessions.append(Session(None, None, status, wall, _last(err), 0, ""))
    _check_session(report, report.sessions[-1], err, out)
    _compare(report, ref, out)
    return report


def _session(argv: list[str], sig: signal.Signals | None, after_s: float, after_load: bool, env: dict | None,
             timeout_s: float) -> tuple[int, str, float | None, float]:
    """Run one session, sending ``sig`` ``after_s`` seconds after it starts (``after_load``: after its
    engine is up) unless it ended first; (status, stderr, seconds to the engine line, wall seconds)."""
    fd, err_path = tempfile.mkstemp(prefix="chaos-", suffix=".err")
    out_fd, out_path = tempfile.mkstemp(prefix="chaos-", suffix=".out")
    t0 = time.monotonic()
    loaded = None
    try:
        with open(fd, "wb") as err, open(out_fd, "wb") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
            try:
                while child.poll() is None and (after_load or sig is None) and loaded is None:
                    if time.monotonic() - t0 > timeout_s:
                        raise subprocess.TimeoutExpired(argv, timeout_s)
                    if _loaded(err_path):
                        loaded = time.monotonic() - t0
                    else:
                        time.sleep(0.02)
                if sig is not None:
                    try:
                        child.wait(timeout=after_s)
                    except subprocess.TimeoutExpired:
                        child.send_signal(sig)
                status = child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                status = HUNG
        said = Path(out_path).read_text(errors="replace") + Path(err_path).read_text(errors="replace")
        return status, said, loaded, time.monotonic() - t0
    finally:
        os.unlink(err_path)
        os.unlink(out_path)


def _written(out: Path) -> int:
    """Lines in the results and round checkpoints of ``out``: how far its run is."""
    count = 0
    for path in (out, Path(f"{out}.rounds.jsonl")):
        if path.exists():
            count += path.read_bytes().count(b"\n")
    return count


def _loaded(err_path: str) -> bool:
    """Whether the session's engine is up: ``pacore run`` says so in a line beginning ``engine:``."""
    with open(err_path, "rb") as f:
        text = f.read()
    return text.startswith(b"engine: ") or b"\nengine: " in text


def _check_session(report: Report, s: Session, err: str, out: Path) -> None:
    n = len(report.sessions)
    where = f"session {n} ({s.signal or 'no signal'}{'' if s.after_s is None else f' after {s.after_s:.2f} s'})"
    if "Traceback" in err:
        report.problems.append(f"{where} printed a traceback: {_tail(err)}")
    if s.status == HUNG:
        report.problems.append(f"{where} hung")
    elif s.signal is None or s.status == 0:
        if s.status != 0:
            report.problems.append(f"{where} exited {s.status}: {_tail(err)}")
    elif s.signal == "SIGKILL":
        if s.status != -signal.SIGKILL:
            report.problems.append(f"{where} exited {s.status}, not -9")
    elif s.status == -signal.SIGTERM:  # before pacore run took SIGTERM over, or after it gave it back
        if err.strip() and "\nsummary: " not in f"\n{err}":  # (a shell shows 143 for both)
            report.problems.append(f"{where} died of SIGTERM while it ran: {_tail(err)}")
    elif s.status != 128 + signal.SIGTERM:
        report.problems.append(f"{where} exited {s.status}, not 143: {_tail(err)}")
    elif not s.last_line.endswith(ENDINGS):
        report.problems.append(f"{where} ended on {s.last_line!r}, not what is saved and how to go on")
    if s.signal != "SIGKILL" and out.exists():  # a stop that is no kill leaves whole lines
        data = out.read_bytes()
        if data and not data.endswith(b"\n"):
            report.problems.append(f"{where} left a torn last line in {out}")


def _compare(report: Report, ref: Path, out: Path) -> None:
    """Whole lines, no duplicates or errors, the lock and snapshots gone, every record as the reference's."""
    leftovers = [Path(f"{os.path.realpath(out)}.lock"), Path(f"{out}.partial"), *out.parent.glob(f"{out.name}*.tmp")]
    for leftover in leftovers:
        if leftover.exists():
            report.problems.append(f"{leftover} is left after the run finished")
    want, got = _records(ref, report, "reference"), _records(out, report, "chaos")
    report.records = len(got)
    if set(want) != set(got):
        report.problems.append(f"records differ in what they are of: missing {sorted(set(want) - set(got))}, "
                               f"extra {sorted(set(got) - set(want))}")
    for key in sorted(set(want) & set(got), key=str):
        for path, a, b in _diff(_content(want[key]), _content(got[key]), f"{key}"):
            report.problems.append(f"{path}: {_short(a)} uninterrupted, {_short(b)} after the kills")
        report.compared_fields += _count(_content(want[key]))


def _records(path: Path, report: Report, what: str) -> dict[tuple, dict]:
    data = path.read_bytes() if path.exists() else b""
    if data and not data.endswith(b"\n"):
        report.problems.append(f"the {what} results end on a torn line")
    records: dict[tuple, dict] = {}
    for n, line in enumerate(data.decode().splitlines(), start=1):
        try:
            rec = json.loads(line)
        except ValueError:
            report.problems.append(f"{what} line {n} is not JSON (torn)")
            continue
        key = (str(rec.get("request_id")), rec.get("run", 0))
        if "error" in rec:
            report.problems.append(f"{what} line {n}: {key} ended in an error: {rec['error']}")
        if key in records:
            report.problems.append(f"{what} line {n}: a second record of {key}")
        records[key] = rec
    return records


def _content(rec: dict) -> dict:
    """``rec`` without its per-session fields."""
    def strip(stats):
        return [{k: v for k, v in s.items() if k not in PER_SESSION} for s in stats]
    out = {**rec, "rounds_stats": strip(rec.get("rounds_stats", []))}
    if isinstance(rec.get("pool"), dict) and isinstance(rec["pool"].get("stats"), dict):
        out["pool"] = {**rec["pool"], "stats": strip([rec["pool"]["stats"]])[0]}
    return out


def _diff(a, b, path: str):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            yield from _diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, a, b


def _count(x) -> int:
    if isinstance(x, dict):
        return sum(_count(v) for v in x.values())
    if isinstance(x, list):
        return sum(_count(v) for v in x)
    return 1


def _short(x) -> str:
    text = json.dumps(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _last(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _tail(err: str) -> str:
    return " | ".join(err.strip().splitlines()[-3:])


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for p in path.iterdir():
            _remove(p)
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("python -m bench.chaos: pass the command after --, e.g. -- python -m pacore run --data FILE ...",
              file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=6, help="interruptions to land (default 6)")
    p.add_argument("--seed", type=int, default=0, help="seeds the moments, the signals and the variants")
    p.add_argument("--variant", action="append", default=[], metavar="FLAGS",
                   help="a flag set (JSON list) a resume may add, e.g. '[\"--speculative-config\", \"{...}\"]'")
    p.add_argument("--out", default="runs/chaos")
    args = p.parse_args(argv[:cut])
    variants = [[]] + [json.loads(v) for v in args.variant]
    report = run_chaos(argv[cut + 1:], args.out, args.kills, args.seed, variants)
    print(report.summary())
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
