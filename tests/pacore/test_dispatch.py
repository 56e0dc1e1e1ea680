"""The driver of data-parallel runs (pacore/dispatch.py) on replicas living in this process, answering in
an order the test sets: which replica gets what, and what happens when one is lost, without timing."""
import dataclasses
import json

import pytest

from pacore.config import RunConfig
from pacore.replicas.driver import MAX_LOSSES, ReplicaError, run_replicated
from pacore.results.files import read_results
from pacore.replicas.worker import ReplicaWorker
from pacore.runner import PaCoReRunner
from pacore_fakes import FakeLLM
from test_pacore_checkpoint import checkpointed_rounds
from test_pacore_parallel import _comparable, _failing_script, _problems, _script, _successes


class InlineReplicas:
    """Replicas in this process. Outstanding calls are answered in turn; replica r answers only one
    turn in ``slowness[r]``, and a replica in ``dead`` answers as a lost one."""

    def __init__(self, cfg, count, slowness=None, script=_script):
        self.count = count
        self.llms = [FakeLLM(script) for _ in range(count)]
        self.workers = [ReplicaWorker(llm, cfg) for llm in self.llms]
        self.slowness = slowness or [1] * count
        self.outstanding = {r: [] for r in range(count)}  # each answers a first time once "loaded"
        self.calls = []  # (rank, problem ids handed)
        self.dead = set()
        self._turn = 0
        self._ticks = [0] * count

    def call(self, rank, work):
        self.calls.append((rank, [w.problem.id for w in work]))
        self.outstanding[rank] = work

    def wait(self, timeout):
        while True:
            ranks = sorted(self.outstanding)
            rank = ranks[self._turn % len(ranks)]
            self._turn += 1
            self._ticks[rank] += 1
            if self._ticks[rank] % self.slowness[rank] == 0:
                break
        work = self.outstanding.pop(rank)
        if rank in self.dead:
            return rank, "killed"
        return rank, self.workers[rank].advance(work)

    def interrupt(self):
        for rank in range(self.count):
            if rank not in self.dead:
                yield rank, self.workers[rank].interrupt()

    def close(self):
        for rank in range(self.count):
            if rank not in self.dead:
                self.workers[rank].close()


def _cfg(tmp_path, n=6, **kw):
    data = tmp_path / "in.jsonl"
    if not data.exists():
        _problems(data, n)
    kw = {"rounds": (3,), "max_problems_in_flight": 1, **kw}
    return RunConfig(data_path=str(data), out_path=str(tmp_path / "out.jsonl"), max_tokens=64,
                     show_progress=False, **kw)


def _run(cfg, count, on_reply=None, **kw):
    made = []

    def start():
        made.append(InlineReplicas(cfg, count, **kw))
        return made[0]
    summary = run_replicated(cfg, start, on_reply)
    return summary, made[0] if made else None


def _single(tmp_path, cfg, name="single"):
    (tmp_path / name).mkdir()
    one = dataclasses.replace(cfg, out_path=str(tmp_path / name / "out.jsonl"), resume=False)
    PaCoReRunner(FakeLLM(_script), one).run()
    return one.out_path


def _requests(llm, pid):
    return [rid for rid, _, _ in llm.calls if rid.split("#")[0] == pid]


def test_a_slow_replica_holds_few_problems_and_none_is_dealt_in_advance(tmp_path):
    cfg = _cfg(tmp_path, n=12)
    summary, replicas = _run(cfg, 2, slowness=[1, 25])
    assert _successes(cfg.out_path) == sorted(f"p{i}" for i in range(12))
    fast, slow = summary["run"]["dispatch"]["problems_per_replica"]
    assert fast + slow == 12 and fast > 2 * slow
    # a replica holds at most max_problems_in_flight + PREFETCH problems, and no more than its share
    assert all(len(ids) <= 3 for _, ids in replicas.calls)
    assert _comparable(cfg.out_path) == _comparable(_single(tmp_path, cfg))


def test_a_lost_replica_s_problem_continues_from_its_checkpoints_and_snapshots(tmp_path):
    cfg = _cfg(tmp_path, n=4, rounds=(3, 2), checkpoint_every_s=1e-6)

    def kill_mid_round_2(replicas, rank, reply):
        if rank == 0 and any(name == "snapshot" and args[0]["round"] == 2 for name, args in reply.events):
            replicas.dead.add(0)
    summary, replicas = _run(cfg, 2, on_reply=kill_mid_round_2)
    assert _successes(cfg.out_path) == ["p0", "p1", "p2", "p3"]
    assert summary["run"]["dispatch"]["lost"] == {"0": "killed"}
    assert summary["run"]["dispatch"]["problems_reassigned"] >= 1
    other = replicas.llms[1]
    assert _requests(other, "p0") == ["p0#r2", "p0#r3"]  # round 1 was checkpointed: not run again
    assert other.resumed["p0#r2"][0] > 0  # round 2 continued from the snapshot the driver had
    assert _comparable(cfg.out_path) == _comparable(_single(tmp_path, cfg))
    assert "replicas: 1 of 2 lost (replica 0: killed), " in _printed(summary)


def _printed(summary):
    from pacore.evaluate.summary import format_summary

    return format_summary(summary)


def test_a_problem_that_breaks_its_replicas_is_failed_not_handed_on(tmp_path):
    cfg = _cfg(tmp_path, n=6)
    summary, _ = _run(cfg, 3, script=_failing_script)  # p3 breaks whichever replica runs it
    recs = read_results(cfg.out_path)
    # only the problem that had started counts a loss: those merely queued beside it are not blamed
    assert [r["request_id"] for r in recs if "error" in r] == ["p3"]
    error = next(r["error"] for r in recs if "error" in r)
    assert f"lost {MAX_LOSSES} times" in error and "replica broke on p3" in error
    assert _successes(cfg.out_path) == ["p0", "p1", "p2", "p4", "p5"]
    assert len(summary["run"]["dispatch"]["lost"]) == MAX_LOSSES


def test_a_replica_that_names_what_it_ran_when_it_broke_blames_only_that(tmp_path):
    # p4 waits behind p3 on both replicas p3 breaks; their tracebacks' answers name p3 alone as started
    cfg = _cfg(tmp_path, n=6)
    with pytest.raises(ReplicaError):
        _run(cfg, 2, script=_failing_script)
    assert [r["request_id"] for r in read_results(cfg.out_path) if "error" in r] == ["p3"]


class _Killed(Exception):
    pass


def _killing_script(prompt, params, rid, i):
    if rid.startswith("p3#"):
        raise _Killed("the GPU's memory")
    return _script(prompt, params, rid, i)


class KilledReplicas(InlineReplicas):
    """p3 kills its replica outright (SIGKILL, out of memory): no reply, what it did this call is lost."""

    def wait(self, timeout):
        rank, answer = super().wait(timeout)
        if not isinstance(answer, str) and answer.error and "_Killed" in answer.error:
            self.dead.add(rank)
            return rank, "killed by signal SIGKILL"
        return rank, answer


def test_a_problem_that_kills_its_replicas_unannounced_is_failed_not_handed_on(tmp_path):
    # p3 waits in its replica's queue behind p2 and starts in the call that kills it, unannounced: the
    # driver still counts it (the first queued problems may have started since the latest answer)
    cfg = _cfg(tmp_path, n=6)
    made = []

    def start():
        made.append(KilledReplicas(cfg, 3, script=_killing_script))
        return made[0]
    summary = run_replicated(cfg, start)  # not every replica lost
    assert made[0].calls[1] == (1, ["p2", "p3"])
    recs = read_results(cfg.out_path)
    assert [r["request_id"] for r in recs if "error" in r] == ["p3"]
    assert _successes(cfg.out_path) == ["p0", "p1", "p2", "p4", "p5"]
    assert len(summary["run"]["dispatch"]["lost"]) == MAX_LOSSES


def test_every_replica_lost_raises_after_saving_and_resume_completes(tmp_path):
    cfg = _cfg(tmp_path, n=6)

    def kill_after_a_record(replicas, rank, reply):
        if any(name == "record" for name, _ in reply.events):
            replicas.dead.add(rank)
    with pytest.raises(ReplicaError, match=r"all 2 replicas were lost with \d+ problems left(.|\n)*--resume"):
        _run(cfg, 2, on_reply=kill_after_a_record)
    done = _successes(cfg.out_path)
    assert len(done) == 2  # one record each before they died
    assert json.load(open(cfg.out_path + ".summary.json"))["completed"] == 2
    cfg.resume = True
    _run(cfg, 2)
    assert _successes(cfg.out_path) == [f"p{i}" for i in range(6)]
    assert len(read_results(cfg.out_path)) == 6  # nothing written twice


def test_a_record_reported_twice_is_written_once(tmp_path):
    cfg = _cfg(tmp_path, n=4)
    seen = []

    def repeat(replicas, rank, reply):  # as if a reply were delivered again
        records = [e for e in reply.events if e[0] == "record"]
        if records and not seen:
            seen.extend(records)
            reply.events.extend(records)
            replicas.workers[rank]._sink.events.extend(records)  # and once more in its next reply
    summary, _ = _run(cfg, 2, on_reply=repeat)
    assert sorted(r["request_id"] for r in read_results(cfg.out_path)) == ["p0", "p1", "p2", "p3"]
    assert summary["run"]["dispatch"]["duplicate_records_dropped"] == 1


def test_runs_and_pools_survive_a_lost_replica(tmp_path):
    cfg = _cfg(tmp_path, n=3, rounds=(2,), runs=3, pool=4, checkpoint_every_s=1e-6)

    def kill_once(replicas, rank, reply):
        if rank == 1 and any(name == "checkpoint" for name, _ in reply.events) and not replicas.dead:
            replicas.dead.add(1)
    summary, _ = _run(cfg, 2, on_reply=kill_once)
    keys = sorted((r["request_id"], r["run"]) for r in read_results(cfg.out_path))
    assert keys == [(f"p{i}", run) for i in range(3) for run in range(3)]  # each (problem, run) once
    assert summary["run"]["dispatch"]["lost"] == {"1": "killed"}
    assert _comparable(cfg.out_path) == _comparable(_single(tmp_path, cfg))


def test_bad_lines_and_more_replicas_than_problems(tmp_path):
    data = tmp_path / "in.jsonl"
    _problems(data, 1)
    with open(data, "a") as f:
        f.write("not json\n")
    cfg = _cfg(tmp_path)
    summary, _ = _run(cfg, 3)
    recs = read_results(cfg.out_path)
    assert [r.get("input_error") for r in recs].count(True) == 1 and _successes(cfg.out_path) == ["p0"]
    assert sorted(summary["run"]["dispatch"]["problems_per_replica"]) == [0, 0, 1]


def test_replicas_continue_from_round_checkpoints(tmp_path):
    cfg = _cfg(tmp_path, rounds=(3, 2), max_problems_in_flight=6)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(_script, interrupt_at_step=30), cfg).run()
    saved = checkpointed_rounds(cfg)
    assert saved
    cfg.resume = True
    _run(cfg, 2)
    recs = read_results(cfg.out_path)
    assert sorted(r["request_id"] for r in recs) == [f"p{i}" for i in range(6)]
    for rec in recs:  # the checkpointed rounds were taken over, not run again
        for done in saved.get(rec["request_id"], []):
            assert rec["rounds_stats"][done["round"] - 1] == done["stats"]


def test_nothing_to_do_starts_no_replica(tmp_path):
    cfg = _cfg(tmp_path, n=2)
    _run(cfg, 2)
    cfg.resume = True
    summary, replicas = _run(cfg, 2)
    assert replicas is None and summary["completed"] == 2
