"""One request must not hold up the others (engine/core/fairness.py), counted in scheduler steps.

No model: each step's plan is fed one token per sampled sequence, so what is pinned is the policy's
decisions (who is prefilled, who runs, who is preempted), step by step. Under first come, first served
(FairShare.fcfs, the scheduler before the fair share) each heavy case holds the short request up for
the whole heavy request; with the defaults it runs within two steps of arriving.
"""
import pytest

from engine.core.block_manager import BlockManager
from engine.config import EngineConfig, add_engine_flags
from engine.core.fairness import FairShare
from engine.sample.sampling_params import SamplingParams
from engine.core.cascade import CascadePolicy
from engine.core.scheduler import Scheduler
from engine.core.sequence import Request, Status
from engine.core.stopping import StopChecker

BUDGET = 2048


def _scheduler(seats=8, blocks=4096, fair=None):
    bm = BlockManager(blocks, 16)
    return Scheduler(bm, StopChecker(None, [], 1 << 20), seats, BUDGET, CascadePolicy(), fair=fair)


def _add(sched, rid, prompt_len, first, n=1, max_tokens=2):
    req = Request(rid, None, list(range(first, first + prompt_len)), SamplingParams(n=n, max_tokens=max_tokens,
                                                                                   ignore_eos=True))
    sched.add_request(req)
    return req


def _step(sched):
    plan = sched.schedule()
    finished = sched.postprocess(plan, [(seq, [5], i) for i, seq in enumerate(plan.sample_seqs)])
    return plan, finished


def _steps_until_done(sched, req, limit=1000):
    for step in range(1, limit + 1):
        _, finished = _step(sched)
        if req in finished:
            return step
    raise AssertionError(f"{req.request_id} did not finish in {limit} steps")


HEAVY = {"long prompt": dict(prompt_len=7701, n=1, max_tokens=40), "n=24": dict(prompt_len=24, n=24, max_tokens=40)}


@pytest.mark.parametrize("case", HEAVY)
def test_a_short_request_behind_a_heavy_one_finishes_within_two_steps(case):
    sched = _scheduler()
    heavy = _add(sched, "heavy", first=1000, **HEAVY[case])
    _step(sched)  # the heavy request starts
    short = _add(sched, "short", 24, first=50_000)
    assert _steps_until_done(sched, short) == 2  # its prompt and first token, then its second token
    assert _steps_until_done(sched, heavy) > 0
    assert all(len(s.generated) == 40 for s in heavy.seqs) and len(heavy.seqs) == HEAVY[case]["n"]


@pytest.mark.parametrize("case", HEAVY)
def test_first_come_first_served_holds_the_short_request_for_the_whole_heavy_one(case):
    """What the fair share fixes: under FCFS the short request waits for the long prompt's whole
    prefill (admitted in its last step), or for the n=24 request's 3 waves of 8 sequences of 40 tokens."""
    sched = _scheduler(fair=FairShare.fcfs(8))
    _add(sched, "heavy", first=1000, **HEAVY[case])
    _step(sched)
    short = _add(sched, "short", 24, first=50_000)
    assert _steps_until_done(sched, short) >= (4 if case == "long prompt" else 80)


def test_a_short_prompt_is_prefilled_beside_a_long_ones_chunk_and_the_step_stays_full():
    sched = _scheduler()
    long = _add(sched, "long", 7701, first=1000)
    plan, _ = _step(sched)
    assert plan.prefills == [(long.seqs[0], BUDGET)]  # alone, it takes the whole budget
    short = _add(sched, "short", 24, first=50_000)
    plan, _ = _step(sched)
    assert plan.prefills == [(long.seqs[0], BUDGET - 24), (short.seqs[0], 24)]


def test_a_prefill_alone_is_chunked_as_first_come_first_served_chunks_it():
    chunks = {}
    for name, fair in (("fair", None), ("fcfs", FairShare.fcfs(8))):
        sched = _scheduler(fair=fair)
        _add(sched, "long", 7701, first=1000, max_tokens=3)
        chunks[name] = [[c for _, c in _step(sched)[0].prefills] for _ in range(6)]
    assert chunks["fair"] == chunks["fcfs"] == [[2048], [2048], [2048], [1557], [], []]


def test_a_request_over_its_share_of_seats_yields_its_newest_sequence_to_a_newcomer():
    sched = _scheduler()
    heavy = _add(sched, "heavy", 24, first=1000, n=24, max_tokens=40)
    _step(sched)  # prefill and fork: the parent and 7 children take the 8 seats
    assert len(sched.running) == 8
    newest = sched.running[-1]
    short = _add(sched, "short", 24, first=50_000)
    plan, _ = _step(sched)
    assert sched.num_preemptions == 1 and newest.status is Status.WAITING
    assert [s.request for s, _ in plan.prefills] == [short]
    assert sum(s.request is heavy for s in sched.running) == 7  # its share: 8 less one seat


def test_a_fork_group_within_its_share_is_admitted_whole_and_keeps_its_seats():
    """A PaCoRe round (n=K on 256 seats; the share is 240) is never split for a newcomer, and a group
    that fits the share beside a newcomer keeps every seat."""
    for seats, k in ((256, 32), (8, 7)):
        sched = _scheduler(seats=seats)
        group = _add(sched, "round", 512, first=1000, n=k, max_tokens=30)
        _step(sched)
        assert sum(s.request is group for s in sched.running) == k  # forked whole in its prompt's step
        short = _add(sched, "short", 24, first=50_000)
        assert _steps_until_done(sched, short) == 2
        assert sched.num_preemptions == 0 and sum(s.request is group for s in sched.running) == k


def test_admission_keeps_the_blocks_an_unfinished_prefill_still_needs():
    """A long prompt part way through its prefill still needs blocks: a prompt admitted beside it may
    use only what is free beyond them, or the long one's growth would preempt it."""
    sched = _scheduler(blocks=520)  # the long prompt's 482 blocks, and 38 more
    long = _add(sched, "long", 7701, first=1000)
    _step(sched)  # 2048 tokens in: 128 blocks taken, 354 still owed
    # 36 blocks and the 5 kept free for growth: they fit in the 392 free, not in the 38 the long one leaves
    other = _add(sched, "other", 16 * 36, first=50_000)
    plan, _ = _step(sched)
    assert [s.request for s, _ in plan.prefills] == [long] and other.seqs[0].status is Status.WAITING
    while long.seqs[0].num_generated == 0:
        _step(sched)
    assert sched.num_preemptions == 0


def test_the_fair_share_defaults_and_their_flags():
    assert FairShare.resolve(8, 2048) == FairShare(512, 7)
    assert FairShare.resolve(256, 2048) == FairShare(512, 240)
    assert FairShare.resolve(1, 2048) == FairShare(512, 1)
    assert FairShare.resolve(8, 2048, 0, 8) == FairShare.fcfs(8) == FairShare(0, 8)
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        EngineConfig(long_prefill_token_threshold=-1)
    with pytest.raises(ValueError, match="max_num_seqs_per_request"):
        EngineConfig(max_num_seqs_per_request=0)
    import argparse
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    args = parser.parse_args(["--long-prefill-token-threshold", "0", "--max-num-seqs-per-request", "8"])
    assert (args.long_prefill_token_threshold, args.max_num_seqs_per_request) == (0, 8)
