"""The driver loop: every run of every problem advances through its rounds on its own, sharing one engine."""
from __future__ import annotations

import sys
import time
from collections import deque

from engine.llm import StepError
from engine.sampling_params import SamplingParams

from .budget import PromptTooLong, check_max_tokens, fit_round_prompt
from .compaction import Trajectory
from .config import RunConfig
from .grading import grade, ground_truth_answer
from .lock import results_lock
from .partial import snapshot_record, usable_snapshot
from .problems import BadLine, Problem
from .progress import Progress
from .prompts import order_responses
from .records import error_record, run_record
from .runs import (POOL, PriorWork, Unit, draw, drawn_round, planned, pool_seed, runs_left, sample_seed,
                   shuffle_seed, usable_pool, usable_rounds, validate_runs)
from .session import INTERRUPTED, pending_work
from .sink import FileSink
from .stats import RoundStats, round_stats_from_output, show_summary, write_summary


class PaCoReRunner:
    """Runs PaCoRe over a JSONL file on an engine with the ``LLM.add_request/step`` interface.

    Each round of each run of a problem is one engine request with ``n=K``; when it finishes, the
    run's next round is submitted in the same loop iteration while the others keep decoding. Output
    goes to ``sink`` (pacore/sink.py): the results files by default; a data-parallel replica's
    events for the driver. A replica is driven with ``begin``, ``add`` and ``step`` instead of ``process``.
    """

    def __init__(self, llm, cfg: RunConfig, sink=None):
        if cfg.max_problems_in_flight < 1:
            raise ValueError("max_problems_in_flight must be at least 1")
        validate_runs(cfg)
        self.llm = llm
        self.cfg = cfg
        self.schedule = cfg.schedule
        self.max_model_len = int(llm.max_model_len)
        self.max_tokens = cfg.max_tokens
        check_max_tokens(self.max_tokens, self.max_model_len)
        self._sink = sink
        self._todo: deque[Problem | BadLine] = deque()
        self._inflight: dict[str, Unit] = {}
        self._open: dict[str, int] = {}  # problem key -> its runs not yet recorded
        self._prior: dict[str, PriorWork] = {}
        self._started_at: float | None = None  # wall clock (time.time), comparable across replicas
        self._finished_at: float | None = None
        self._progress: Progress | None = None
        self.generated_tokens = 0  # this session, finished rounds only

    # -- public ------------------------------------------------------------------------------
    def run(self) -> dict:
        """Run every problem not yet in the output; returns (and writes) the run summary."""
        with results_lock(self.cfg.out_path):  # re-entrant: the CLI already holds it
            todo, prior = pending_work(self.cfg)
            start = time.perf_counter()
            self.process(todo, prior)
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
        own_sink = self._sink is None
        if own_sink:
            self._sink = FileSink(self.cfg.out_path)
        self.begin(prior, trajectories, rounds)
        self._todo.extend(items)
        try:
            while self.busy:
                self.step()
        except BaseException as e:
            self.snapshot_safely()  # Ctrl-C or a crash: the rounds in flight continue from here on --resume
            if isinstance(e, KeyboardInterrupt):
                print(f"\n{INTERRUPTED.format(out=self.cfg.out_path)}", file=sys.stderr)
            raise
        finally:
            self.end()
            if own_sink:
                self._sink.close()
                self._sink = None

    def begin(self, prior: dict[str, PriorWork] | None = None, trajectories: int = 0, rounds: int = 0) -> None:
        """Start a session (its clock, progress bar and snapshot timer) before ``add`` and ``step``."""
        self._prior = dict(prior or {})
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
            self._prior[problem.key] = prior
        self._todo.append(problem)

    @property
    def busy(self) -> bool:
        """Whether a problem is queued or has a round in the engine."""
        return bool(self._todo or self._inflight)

    @property
    def started(self) -> list[str]:
        """The keys of the problems started and not yet closed (queued ones are not started)."""
        return list(self._open)

    def snapshot_safely(self) -> None:
        """``snapshot``, reporting (never raising) a failure: it runs while another error unwinds."""
        try:
            self.snapshot()
        except Exception as snap_error:
            print(f"pacore: could not snapshot the rounds in flight: {snap_error}", file=sys.stderr)

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
                # keyed by its line, so it never counts as (or shadows) a problem of that id
                self._write(error_record(item.id, None, item.error, item.line_no, input_error=True), item.extra)
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
            unit = self._inflight.pop(out.request_id, None)
            if unit is not None:  # requests someone else added are not ours to handle
                self._round_finished(unit, out)
        self._progress.tick()
        every = self.cfg.checkpoint_every_s
        if every > 0 and time.monotonic() - self._last_snapshot >= every:
            self.snapshot()

    def _start(self, problem: Problem) -> None:
        """Begin a problem's runs left: each at its next round, or all at once from its pool."""
        runs = runs_left(self.cfg, self._prior.get(problem.key))
        if not runs:
            self._sink.closed(problem.key)
            return
        self._open[problem.key] = len(runs)
        gold = ground_truth_answer(problem.extra)
        if not self.cfg.pool:
            for run in runs:
                self._advance(self._restore(Unit(problem, gold, run)))
            return
        pool = Unit(problem, gold, POOL, waiting=runs)
        rec = usable_pool(self.cfg, self._prior.get(problem.key))
        if rec is not None:
            self._progress.round_done(self.cfg.pool, 0)
            self._pool_done(pool, [Trajectory.from_record(t, i) for i, t in enumerate(rec["responses"])],
                            rec["stats"])
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
        for request_id, partial in error.partial.items():
            unit = self._inflight.pop(request_id, None)
            if unit is None:
                continue
            self._save_partial(unit, partial)
            self._fail(unit, f"round {unit.round_idx + 1}: {error}")

    def snapshot(self) -> None:
        """Save every round in flight (its trajectories' tokens so far) for --resume."""
        self._last_snapshot = time.monotonic()
        for request_id, unit in self._inflight.items():
            try:
                partial = self.llm.partial_outputs(request_id)
            except KeyError:  # finished in the engine, its output not handled yet (a stop mid-step)
                continue
            self._save_partial(unit, partial)

    def _save_partial(self, unit: Unit, partial: list) -> None:
        if any(tokens for tokens, _ in partial):
            self._sink.snapshot(snapshot_record(unit.key, unit.round_idx + 1, len(partial), self.cfg.seed,
                                                unit.prompt, partial))

    def _submit(self, unit: Unit) -> None:
        """Build and add the engine request of ``unit``'s current round."""
        r = unit.round_idx
        problem = unit.problem
        refs: list[str] | None = None
        unit.dropped = 0
        if r > 0:
            # Already in reference order (_complete_round); empty responses are left out.
            refs = [t.message for t in unit.rounds[-1] if t.passes_on]
            unit.dropped = len(unit.rounds[-1]) - len(refs)
        try:
            prompt = fit_round_prompt(self.llm.tokenizer, problem.messages, refs, max_model_len=self.max_model_len,
                                      max_tokens=self.max_tokens, message_token_cap=self.cfg.message_token_cap)
            # Per problem, run and round, so results do not depend on what else was scheduled.
            seed = (pool_seed(self.cfg.seed, problem.key) if unit.run == POOL
                    else sample_seed(self.cfg.seed, problem.key, unit.run, r))
            params = SamplingParams(n=self.cfg.pool if unit.run == POOL else self.schedule[r],
                                    temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                    max_tokens=prompt.max_tokens, seed=seed)
            request_id = f"{unit.key}#r{r + 1}"
            unit.prompt = prompt.token_ids
            unit.resumed_tokens = self._add_request(unit, params, request_id)
        except (PromptTooLong, ValueError) as e:
            # PromptTooLong is ours; ValueError is the engine refusing a prompt it can never fit.
            self._fail(unit, f"round {r + 1}: {e}")
            return
        unit.references = len(refs or [])
        unit.truncated, unit.truncated_tokens = prompt.truncated_messages, prompt.truncated_tokens
        self._inflight[request_id] = unit

    def _add_request(self, unit: Unit, params: SamplingParams, request_id: str) -> int:
        """Add the round's request, continuing its snapshot if there is one; returns the tokens resumed."""
        r = unit.round_idx
        resume = usable_snapshot(self._sink.load_snapshot(unit.key, r + 1), unit.key, params.n, self.cfg.seed,
                                 unit.prompt)
        if resume is not None:
            try:
                self.llm.add_request(unit.prompt, params, request_id=request_id, resume=resume)
                return sum(len(tokens) for tokens, _ in resume)
            except ValueError as e:
                print(f"pacore: problem {unit.problem.id!r} round {r + 1}: snapshot not usable ({e}); "
                      f"starting the round over", file=sys.stderr)
        self.llm.add_request(unit.prompt, params, request_id=request_id)
        return 0

    def _round_finished(self, unit: Unit, out) -> None:
        r = unit.round_idx
        trajectories = [Trajectory(c.index, c.text, c.finish_reason, len(c.token_ids))
                        for c in sorted(out.outputs, key=lambda c: c.index)]
        stats = round_stats_from_output(
            r + 1, len(trajectories), out, references=unit.references, dropped=unit.dropped,
            truncated=unit.truncated, truncated_tokens=unit.truncated_tokens, resumed=unit.resumed_tokens)
        self.generated_tokens += stats.generated_tokens - unit.resumed_tokens  # this session's work
        self._progress.round_done(len(trajectories), stats.generated_tokens)
        if unit.run == POOL:
            self._checkpoint(unit, trajectories, stats)
            self._pool_done(unit, trajectories, stats.to_dict())
        else:
            self._complete_round(unit, trajectories, stats)
        self._sink.drop_snapshot(unit.key, r + 1)  # only once the round is safely on disk

    def _pool_done(self, pool: Unit, trajectories: list[Trajectory], pool_stats: dict) -> None:
        """Start each waiting run at round 2 with its own draw of K1 pool trajectories as round 1."""
        problem, k1 = pool.problem, self.schedule[0]
        generated = sum(t.tokens for t in trajectories)
        for run in pool.waiting:
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
            flags = [ok for _, ok in graded if ok is not None]
            stats.accuracy = sum(flags) / len(flags) if flags else None
        unit.rounds.append(ordered)
        unit.stats.append(stats)
        if checkpoint and r + 1 < len(self.schedule):
            # A long round is not lost with a later one: resume continues from here.
            self._checkpoint(unit, ordered, stats)
        unit.round_idx += 1
        if unit.pool is not None and unit.round_idx == 1:
            self._restore(unit)
        self._advance(unit)

    def _checkpoint(self, unit: Unit, trajectories: list[Trajectory], stats: RoundStats) -> None:
        self._sink.checkpoint({"request_id": unit.problem.id, "run": unit.run, "round": unit.round_idx + 1,
                                  "k": len(trajectories), "seed": self.cfg.seed, "shuffle": self.cfg.shuffle,
                                  "pool": self.cfg.pool, "responses": [t.to_record() for t in trajectories],
                                  "stats": stats.to_dict()})

    def _restore(self, unit: Unit) -> Unit:
        """Put back the rounds an earlier session finished, if they match this run's settings."""
        # unit.round_idx is 1 when round 1 was drawn from the pool
        records, dropped = usable_rounds(self.cfg, self._prior.get(unit.problem.key), unit.run, unit.round_idx)
        if dropped:
            print(f"pacore: problem {unit.problem.id!r} run {unit.run}: its checkpointed rounds were run with "
                  f"another --rounds/--seed/--shuffle/--pool; starting it over", file=sys.stderr)
        for rec in records:
            unit.rounds.append([Trajectory.from_record(t, i) for i, t in enumerate(rec["responses"])])
            unit.stats.append(RoundStats(**rec["stats"]))
            self._progress.round_done(rec["k"], 0)
        unit.round_idx += len(records)
        return unit

    # -- records -----------------------------------------------------------------------------
    def _finish(self, unit: Unit) -> None:
        self._write(run_record(unit.problem.id, unit.run, unit.rounds, unit.stats, gold=unit.gold,
                               graded=self.cfg.grade, k1=self.schedule[0], pool=unit.pool), unit.problem.extra)
        self._closed(unit.problem)

    def _fail(self, unit: Unit, error: str) -> None:
        runs = unit.waiting if unit.run == POOL else [unit.run]
        print(f"pacore: problem {unit.problem.id!r} failed: {error}", file=sys.stderr)
        if unit.run == POOL:
            self._progress.problem_failed(*planned(self.cfg, len(runs)))
        else:
            self._progress.problem_failed(sum(self.schedule[unit.round_idx:]), len(self.schedule) - unit.round_idx)
        for run in runs:
            self._write(error_record(unit.problem.id, run, error, unit.problem.line_no,
                                     round_responses=[[t.to_record() for t in rnd] for rnd in unit.rounds],
                                     rounds_stats=[s.to_dict() for s in unit.stats]), unit.problem.extra)
            self._closed(unit.problem)

    def _closed(self, problem: Problem) -> None:
        self._open[problem.key] -= 1
        if not self._open[problem.key]:
            del self._open[problem.key]
            self._sink.closed(problem.key)

    def _write(self, record: dict, extra: dict) -> None:
        for key, value in extra.items():
            record.setdefault(key, value)
        self._sink.record(record)


def _engine_stats(llm) -> dict:
    try:
        return dict(llm.stats())
    except Exception as e:  # stats are informative; a failure must not lose the run summary
        return {"error": str(e)}


def run_pacore(llm, cfg: RunConfig, print_summary: bool = True) -> dict:
    """Run PaCoRe with ``cfg`` on ``llm``; prints and returns the summary."""
    summary = PaCoReRunner(llm, cfg).run()
    if print_summary:
        show_summary(summary, cfg)
    return summary
