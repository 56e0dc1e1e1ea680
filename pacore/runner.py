"""The round state machine: every run of every problem advances through its rounds on its own, sharing
one engine. What it writes and continues from is its journal's (results/journal.py); what it moves
through the rounds is unit.py's.

Over 300 lines: one class, whose session API (run, process, begin/add/step for a replica) and round
transitions (start, submit, finish, fail) share its state and read best together.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from engine.llm import StepError
from engine.sample.sampling_params import SamplingParams

from .budget import PromptTooLong, fit_round_prompt
from .compaction import Trajectory
from .config import RunConfig
from .evaluate.confidence import TOP_K, trajectory_confidence
from .evaluate.grading import grade, ground_truth_answer, ungradable
from .evaluate.records import bad_line_record, error_record, run_record, with_extra
from .evaluate.runs import draw, drawn_round, planned, shuffle_seed, validate_runs
from .evaluate.stats import RoundStats, round_stats_from_output
from .evaluate.summary import show_summary, write_summary
from .progress import Progress
from .prompts import order_responses
from .results.journal import Journal
from .results.files import check_present
from .results.keys import request_id
from .results.preflight import COMPLETE, INTERRUPTED, Interrupted, Pending, preflight
from .results.problems import BadLine, Problem
from .results.resume import PriorWork, runs_left
from .results.sink import FileSink
from .results.snapshots import finished_without_logprobs
from .unit import InFlight, Pool, Unit

STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # what pacore run stops on as Ctrl-C (cli/run.py)


class PaCoReRunner:
    """Runs PaCoRe over a JSONL file on an engine with the ``LLM.add_request/step`` interface.

    Each round of each run of a problem is one engine request with ``n=K``; when it finishes, the
    run's next round is submitted in the same loop iteration while the others keep decoding. Output
    goes to ``sink`` (results/sink.py): the results files by default; a data-parallel replica's
    events for the driver. A replica is driven with ``begin``, ``add`` and ``step`` instead of ``process``.
    """

    def __init__(self, llm, cfg: RunConfig, sink=None, interrupted: str = INTERRUPTED):
        if cfg.max_problems_in_flight < 1:
            raise ValueError("max_problems_in_flight must be at least 1")
        validate_runs(cfg)
        self.llm = llm
        self.cfg = cfg
        self.schedule = cfg.schedule
        self.max_model_len = int(llm.max_model_len)
        self.max_tokens = cfg.max_tokens
        self._journal = Journal(cfg, sink)
        self._todo: deque[Problem | BadLine] = deque()
        self._inflight: dict[str, Unit | Pool] = {}
        self._open: dict[str, int] = {}  # problem key -> its runs not yet recorded
        self._started_at: float | None = None  # wall clock (time.time), comparable across replicas
        self._finished_at: float | None = None
        self._progress: Progress | None = None
        self.generated_tokens = 0  # this session, finished rounds only
        self._speculative = getattr(llm, "speculator", None) is not None  # its counters go in RoundStats
        self.interrupted = interrupted  # what Ctrl-C prints ({out}: the results path): how to go on

    # -- public ------------------------------------------------------------------------------
    def run(self) -> dict:
        """Run every problem not yet in the output; returns (and writes) the run summary."""
        with preflight(self.cfg, self.max_model_len) as pending:
            return self.run_pending(pending)

    def run_pending(self, pending: Pending) -> dict:
        """Run what a preflight found to do (the results lock held); returns (and writes) the summary."""
        start = time.perf_counter()
        try:
            self.process(pending.todo, pending.prior)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (cli/run.py): the summary of what is done
            write_summary(self.cfg, time.perf_counter() - start, [self.session_stats()])
            raise
        return write_summary(self.cfg, time.perf_counter() - start, [self.session_stats()])

    def process(self, items: list[Problem | BadLine], prior: dict[str, PriorWork] | None = None) -> None:
        """Run ``items`` to completion, appending one record per run of a problem as it ends.

        ``prior`` (problem key -> what earlier sessions finished: done runs, checkpointed rounds, the
        pool) lets a problem skip its done runs and continue the others at their next round.
        """
        prior = prior or {}
        trajectories = rounds = 0
        for item in items:
            if isinstance(item, Problem):
                t, r = planned(self.cfg, len(runs_left(self.cfg, prior.get(item.key))))
                trajectories, rounds = trajectories + t, rounds + r
        own_sink = self._journal.sink is None
        if own_sink:
            self._journal.sink = FileSink(self.cfg.out_path)
        self.begin(prior, trajectories, rounds)
        self._todo.extend(items)
        try:
            while self.busy:
                self.step()
        except BaseException as e:
            self.snapshot_safely()  # Ctrl-C or a crash: the rounds in flight continue from here on --resume
            if not isinstance(e, KeyboardInterrupt):
                raise
            said = self.interrupted if self.busy or self._open else COMPLETE  # a stop after the last record
            print(f"\n{said.format(out=self.cfg.out_path)}", file=sys.stderr)
            raise Interrupted from None
        finally:
            self.end()
            if own_sink:
                self._journal.sink.close()
                self._journal.sink = None

    def begin(self, prior: dict[str, PriorWork] | None = None, trajectories: int = 0, rounds: int = 0) -> None:
        """Start a session (its clock, progress bar and snapshot timer) before ``add`` and ``step``."""
        self._journal.prior = dict(prior or {})
        self._started_at, self._finished_at = time.time(), None
        self._last_snapshot = time.monotonic()
        self._progress = Progress(self.llm, total_trajectories=trajectories, total_rounds=rounds,
                                  enabled=self.cfg.show_progress)

    def end(self) -> None:
        self._progress.close()
        self._finished_at = time.time()

    def add(self, problem: Problem, prior: PriorWork | None = None) -> None:
        """Queue a problem for this session, with what earlier sessions (or a lost replica) finished of it."""
        if prior is not None:
            self._journal.prior[problem.key] = prior
        self._todo.append(problem)

    @property
    def busy(self) -> bool:
        """Whether a problem is queued or has a round in the engine."""
        return bool(self._todo or self._inflight)

    @property
    def started(self) -> list[str]:
        """The keys of the problems started and not yet closed (queued ones are not started)."""
        return list(self._open)

    def snapshot_safely(self, then: str = "") -> None:
        """``snapshot``, reporting (never raising) a failure: it runs while another error unwinds, or
        periodically, where a failure (a full disk) must not stop the run."""
        try:
            self.snapshot()
        except Exception as snap_error:
            if isinstance(self._journal.sink, FileSink):  # a removed output is no passing failure: stop
                check_present(os.path.realpath(self.cfg.out_path))
            print(f"pacore: could not snapshot the rounds in flight: {snap_error}" + (f"; {then}" if then else ""),
                  file=sys.stderr)

    def session_stats(self) -> dict:
        """What this runner generated, with the engine's counters (one entry of the summary's run)."""
        return {
            "generated_tokens": self.generated_tokens,
            "max_tokens": self.max_tokens,
            "max_model_len": self.max_model_len,
            "engine_stats": _engine_stats(self.llm),
            "started_at": self._started_at,
            "finished_at": self._finished_at,
        }

    # -- the loop ----------------------------------------------------------------------------
    def step(self) -> None:
        """Start queued problems while there is room, then run one engine step and handle what finished."""
        while self._todo and len(self._open) < self.cfg.max_problems_in_flight:
            item = self._todo.popleft()
            if isinstance(item, BadLine):
                self._journal.record(bad_line_record(item))
                print(f"pacore: skipped {item.error}", file=sys.stderr)
                continue
            self._start(item)
        if not self._inflight:
            return
        try:
            finished = self.llm.step()
        except StepError as e:
            self._step_failed(e)
            return
        if not finished and not self.llm.has_unfinished():
            raise RuntimeError(
                f"the engine has no unfinished requests but {len(self._inflight)} rounds never "
                f"returned: {sorted(self._inflight)[:5]}"
            )
        for out in finished:
            job = self._inflight.pop(out.request_id, None)
            if job is not None:  # requests someone else added are not ours to handle
                self._round_finished(job, out)
        self._progress.tick()
        every = self.cfg.checkpoint_every_s
        if every > 0 and time.monotonic() - self._last_snapshot >= every:
            # A snapshot is a shortcut for --resume, not a result: a full disk here is said, and the
            # next one tries again; only a results record that cannot be written stops the run.
            self.snapshot_safely(then="the next snapshot tries again")

    def _start(self, problem: Problem) -> None:
        """Begin a problem's runs left: each at its next round, or all at once from its pool."""
        runs = self._journal.runs_left(problem.key)
        if not runs:
            self._journal.closed(problem.key)
            return
        self._open[problem.key] = len(runs)
        gold = ground_truth_answer(problem.extra)
        if gold is None and self.cfg.grade:  # said once per problem; the summary lists them too
            print(f"pacore: not graded: {problem.id} ({ungradable(problem.extra)})", file=sys.stderr)
        if not self.cfg.pool:
            for run in runs:
                self._advance(self._restore(Unit(problem, gold, run)))
            return
        pool = Pool(problem, gold, runs)
        done = self._journal.pool(problem.key)
        if done is not None:
            self._progress.round_done(self.cfg.pool, 0)
            self._pool_done(pool, *done)
        else:
            self._submit(pool)

    def _advance(self, unit: Unit) -> None:
        if unit.round_idx < len(self.schedule):
            self._submit(unit)
        else:  # the final round is done
            self._finish(unit)

    def _step_failed(self, error: StepError) -> None:
        """The engine aborted the rounds of a failed step: keep their tokens for --resume, record
        their runs as failed (so --resume runs them again, from those tokens), carry on with the rest."""
        for rid, partial in error.partial.items():
            job = self._inflight.pop(rid, None)
            if job is None:
                continue
            logprobs = error.logprobs.get(rid) if self.cfg.record_confidence else None
            self._journal.snapshot(job.key, job.round_idx + 1, job.current.prompt, partial, logprobs)
            self._fail(job, f"round {job.round_idx + 1}: {error}")

    def snapshot(self) -> None:
        """Save every round in flight (its trajectories' tokens so far, with --record-confidence their
        logprobs too) for --resume."""
        self._last_snapshot = time.monotonic()
        for rid, job in self._inflight.items():
            try:
                partial = self.llm.partial_outputs(rid)
                logprobs = self.llm.partial_logprobs(rid) if self.cfg.record_confidence else None
            except KeyError:  # finished in the engine, its output not handled yet (a stop mid-step)
                continue
            self._journal.snapshot(job.key, job.round_idx + 1, job.current.prompt, partial, logprobs)

    def _submit(self, job: Unit | Pool) -> None:
        """Build and add the engine request of ``job``'s current round."""
        r = job.round_idx
        problem = job.problem
        refs: list[str] | None = None
        job.current = now = InFlight()
        if r > 0:
            # Already in reference order (_complete_round); empty responses are left out.
            refs = [t.message for t in job.rounds[-1] if t.passes_on]
            now.dropped = len(job.rounds[-1]) - len(refs)
        try:
            prompt = fit_round_prompt(self.llm.tokenizer, problem.messages, refs, max_model_len=self.max_model_len,
                                      max_tokens=self.max_tokens, message_token_cap=self.cfg.message_token_cap)
            n, seed = job.sampling(self.cfg)
            params = SamplingParams(n=n, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                    max_tokens=prompt.max_tokens, seed=seed,
                                    logprobs=TOP_K if self.cfg.record_confidence else None)
            rid = request_id(job.key, r + 1)
            now.prompt = prompt.token_ids
            now.resumed_tokens = self._add_request(job, params, rid)
        except (PromptTooLong, ValueError) as e:
            # PromptTooLong is ours; ValueError is the engine refusing a prompt it can never fit.
            self._fail(job, f"round {r + 1}: {e}")
            return
        now.references = len(refs or [])
        now.truncated, now.truncated_tokens = prompt.truncated_messages, prompt.truncated_tokens
        self._inflight[rid] = job

    def _add_request(self, job: Unit | Pool, params: SamplingParams, rid: str) -> int:
        """Add the round's request, continuing its snapshot if there is one; returns the tokens resumed.

        With --record-confidence the snapshot's logprobs continue too; a snapshot taken without them
        leaves the engine to recompute them from the tokens, which it cannot for a finished trajectory:
        that round starts over, said in the command line's terms."""
        r, prompt = job.round_idx, job.current.prompt
        snapshot = self._journal.resume_tokens(job.key, r + 1, params.n, prompt, params.logprobs)
        where = f"pacore: problem {job.problem.id!r} round {r + 1}"
        if snapshot is not None:
            resume, logprobs = snapshot
            lacking = finished_without_logprobs(resume, logprobs) if params.logprobs is not None else None
            if lacking is not None:
                print(f"{where}: its snapshot cannot be continued with --record-confidence: trajectory {lacking} "
                      f"had finished, and its logprobs were not saved with it (the snapshot was taken without "
                      f"--record-confidence, or they could not be read back), so its confidence cannot be "
                      f"measured; starting the round over", file=sys.stderr)
                snapshot = None
        if snapshot is not None:
            try:
                self.llm.add_request(prompt, params, request_id=rid, resume=resume, resume_logprobs=logprobs)
                return sum(len(tokens) for tokens, _ in resume)
            except ValueError as e:  # tokens the engine refuses (beyond max_tokens, the vocabulary, ...)
                print(f"{where}: its snapshot does not fit this round (the engine refused it: {e}); starting the "
                      f"round over", file=sys.stderr)
        self.llm.add_request(prompt, params, request_id=rid)
        return 0

    def _round_finished(self, job: Unit | Pool, out) -> None:
        r, now = job.round_idx, job.current
        trajectories = [Trajectory(c.index, c.text, c.finish_reason, len(c.token_ids), self._confidence(c))
                        for c in sorted(out.outputs, key=lambda c: c.index)]
        stats = round_stats_from_output(
            r + 1, len(trajectories), out, references=now.references, dropped=now.dropped,
            truncated=now.truncated, truncated_tokens=now.truncated_tokens, resumed=now.resumed_tokens,
            speculative=self._speculative)
        self.generated_tokens += stats.generated_tokens - now.resumed_tokens  # this session's work
        self._progress.round_done(len(trajectories), stats.generated_tokens)
        if isinstance(job, Pool):
            self._journal.checkpoint(job.problem.id, None, 1, trajectories, stats)
            self._pool_done(job, trajectories, stats.to_dict())
        else:
            self._complete_round(job, trajectories, stats)
        self._journal.round_saved(job.key, r + 1)  # only once the round is safely on disk

    def _confidence(self, c):
        """A finished trajectory's confidence measures (with --record-confidence). Its logprobs are let
        go here: at PaCoRe-8B's shape a round's are ~1.5M positions of 21 pairs each."""
        if not self.cfg.record_confidence:
            return None
        confidence = trajectory_confidence(c.logprobs)
        c.logprobs = None
        return confidence

    def _pool_done(self, pool: Pool, trajectories: list[Trajectory], pool_stats: dict) -> None:
        """Start each waiting run at round 2 with its own draw of K1 pool trajectories as round 1."""
        problem, k1 = pool.problem, self.schedule[0]
        generated = sum(t.tokens for t in trajectories)
        for run in pool.runs:
            unit = Unit(problem, pool.gold, run)
            indices = draw(len(trajectories), k1, self.cfg.seed, problem.key, run)
            drawn, stats = drawn_round(trajectories, pool_stats, indices, k1)
            unit.pool = {"size": len(trajectories), "indices": indices, "generated_tokens": generated,
                         "stats": pool_stats}
            self._complete_round(unit, drawn, stats, checkpoint=False)  # the pool and the draw say it all

    def _complete_round(self, unit: Unit, trajectories: list[Trajectory], stats: RoundStats,
                        checkpoint: bool = True) -> None:
        """Order a finished round as it is recorded and passed on, grade it, then go on to the next round."""
        r = unit.round_idx
        ordered = order_responses(trajectories, self.cfg.shuffle,
                                  shuffle_seed(self.cfg.seed, unit.problem.key, unit.run, r + 1))
        if self.cfg.grade:
            graded = [grade(t.message.strip(), unit.gold) for t in ordered]
            stats.answers = [a for a, _ in graded]  # in the recorded order, like round_responses
            if self.cfg.record_confidence:
                stats.correct = [ok for _, ok in graded]
            flags = [ok for _, ok in graded if ok is not None]
            stats.accuracy = sum(flags) / len(flags) if flags else None
        unit.rounds.append(ordered)
        unit.stats.append(stats)
        if checkpoint and r + 1 < len(self.schedule):
            # A long round is not lost with a later one: resume continues from here.
            self._journal.checkpoint(unit.problem.id, unit.run, r + 1, ordered, stats)
        unit.round_idx += 1
        if unit.pool is not None and unit.round_idx == 1:
            self._restore(unit)
        self._advance(unit)

    def _restore(self, unit: Unit) -> Unit:
        """Put back the rounds an earlier session finished (unit.round_idx is 1 when round 1 was drawn
        from the pool)."""
        for trajectories, stats, k in self._journal.restore(unit.problem, unit.run, unit.round_idx):
            unit.rounds.append(trajectories)
            unit.stats.append(stats)
            unit.round_idx += 1
            self._progress.round_done(k, 0)
        return unit

    # -- records -----------------------------------------------------------------------------
    def _finish(self, unit: Unit) -> None:
        record = with_extra(run_record(unit.problem.id, unit.run, unit.rounds, unit.stats, gold=unit.gold,
                                       graded=self.cfg.grade, k1=self.schedule[0], pool=unit.pool), unit.problem.extra)
        with signals_held():  # a stop lands before the record or after its run is closed: it says what is left
            self._journal.record(record)
            self._closed(unit.problem)

    def _fail(self, job: Unit | Pool, error: str) -> None:
        print(f"pacore: problem {job.problem.id!r} failed: {error}", file=sys.stderr)
        self._progress.problem_failed(*job.left(self.cfg))
        for run in job.runs:
            record = with_extra(error_record(job.problem.id, run, error, job.problem.line_no,
                                             round_responses=[[t.to_record() for t in rnd] for rnd in job.rounds],
                                             rounds_stats=[s.to_dict() for s in job.stats]), job.problem.extra)
            with signals_held():
                self._journal.record(record)
                self._closed(job.problem)

    def _closed(self, problem: Problem) -> None:
        self._open[problem.key] -= 1
        if not self._open[problem.key]:
            del self._open[problem.key]
            self._journal.closed(problem.key)


@contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait (blocked, then delivered on leaving) while inside: what is written
    and what the runner knows of it stay in step."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _engine_stats(llm) -> dict:
    try:
        return dict(llm.stats())
    except Exception as e:  # stats are informative; a failure must not lose the run summary
        return {"error": str(e)}


def run_pacore(llm, cfg: RunConfig, print_summary: bool = True, pending: Pending | None = None,
               interrupted: str = INTERRUPTED) -> dict:
    """Run PaCoRe with ``cfg`` on ``llm``; prints and returns the summary. ``pending``: what a preflight
    already found to do (results/preflight.py), its lock held; without it the runner takes its own.
    ``interrupted``: the line Ctrl-C prints (default: pacore run's, which names --resume)."""
    runner = PaCoReRunner(llm, cfg, interrupted=interrupted)
    summary = runner.run() if pending is None else runner.run_pending(pending)
    if print_summary:
        show_summary(summary, cfg)
    return summary
