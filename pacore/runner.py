"""The driver loop: every problem advances through its rounds on its own, sharing one engine."""
from __future__ import annotations

import sys
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams

from .budget import PromptTooLong, check_max_tokens, fit_round_prompt
from .compaction import Trajectory
from .config import RunConfig
from .grading import answers_equal, grade, ground_truth_answer, majority_vote
from .io import (BadLine, Problem, ResultsWriter, prepare_output, read_problems, read_round_checkpoints, rounds_path,
                 select_pending)
from .partial import PartialStore
from .progress import Progress
from .prompts import order_responses
from .seeds import derive_seed
from .stats import RoundStats, round_stats_from_output, show_summary, write_summary


@dataclass(slots=True)
class _ProblemState:
    problem: Problem
    gold: str | None
    round_idx: int = 0  # the round in flight, 0-based
    rounds: list[list[Trajectory]] = field(default_factory=list)  # each in its recorded (reference) order
    stats: list[RoundStats] = field(default_factory=list)
    # the round in flight: its prompt, what it resumed, and bookkeeping for its stats
    prompt: list[int] = field(default_factory=list)
    resumed_tokens: int = 0
    references: int = 0
    dropped: int = 0
    truncated: int = 0
    truncated_tokens: int = 0


class PaCoReRunner:
    """Runs PaCoRe over a JSONL file on an engine with the ``LLM.add_request/step`` interface.

    Each round of each problem is one engine request with ``n=K``; when it finishes, the problem's
    next round is submitted in the same loop iteration while other problems keep decoding.
    """

    def __init__(self, llm, cfg: RunConfig):
        if cfg.max_problems_in_flight < 1:
            raise ValueError("max_problems_in_flight must be at least 1")
        self.llm = llm
        self.cfg = cfg
        self.schedule = cfg.schedule
        self.max_model_len = int(llm.max_model_len)
        self.max_tokens = cfg.max_tokens
        check_max_tokens(self.max_tokens, self.max_model_len)
        self._inflight: dict[str, _ProblemState] = {}
        self._writer: ResultsWriter | None = None
        self._round_writer: ResultsWriter | None = None
        self._checkpoints: dict[str, list[dict]] = {}
        self._started_at: float | None = None  # wall clock (time.time), comparable across replicas
        self._finished_at: float | None = None
        self._progress: Progress | None = None
        self.generated_tokens = 0  # this session, finished rounds only

    # -- public ------------------------------------------------------------------------------
    def run(self) -> dict:
        """Run every problem not yet in the output; returns (and writes) the run summary."""
        todo, checkpoints = pending_work(self.cfg)
        start = time.perf_counter()
        self.process(todo, checkpoints)
        return write_summary(self.cfg, time.perf_counter() - start, [self.session_stats()])

    def process(self, items: list[Problem | BadLine], checkpoints: dict[str, list[dict]] | None = None,
                desc: str = "pacore", position: int = 0, interrupt_hint: bool = True) -> None:
        """Run ``items`` to completion, appending one record per problem to the output as it ends.

        ``checkpoints`` (problem key -> records of its finished rounds, from an earlier session)
        let a problem continue at its next round instead of starting over.
        """
        self._checkpoints = checkpoints or {}
        self._started_at, self._finished_at = time.time(), None
        self._partials = PartialStore(self.cfg.out_path)
        self._last_snapshot = time.monotonic()
        n_problems = sum(isinstance(x, Problem) for x in items)
        self._progress = Progress(
            self.llm,
            total_trajectories=n_problems * sum(self.schedule),
            total_rounds=n_problems * len(self.schedule),
            enabled=self.cfg.show_progress,
            desc=desc,
            position=position,
        )
        try:
            with ResultsWriter(self.cfg.out_path) as self._writer, \
                    ResultsWriter(rounds_path(self.cfg.out_path)) as self._round_writer:
                self._loop(deque(items))
        except BaseException as e:
            try:
                self._snapshot()  # Ctrl-C or a crash: the rounds in flight continue from here on --resume
            except Exception as snap_error:  # never hide the original failure behind this one
                print(f"pacore: could not snapshot the rounds in flight: {snap_error}", file=sys.stderr)
            if interrupt_hint and isinstance(e, KeyboardInterrupt):
                print(f"\n{INTERRUPTED.format(out=self.cfg.out_path)}", file=sys.stderr)
            raise
        finally:
            self._progress.close()
            self._finished_at = time.time()

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
    def _loop(self, todo: deque) -> None:
        while todo or self._inflight:
            while todo and len(self._inflight) < self.cfg.max_problems_in_flight:
                item = todo.popleft()
                if isinstance(item, BadLine):
                    # keyed by its line, so it never counts as (or shadows) a problem of that id
                    self._write_error(item.id, item.error, item.line_no, item.extra, input_error=True)
                    print(f"pacore: skipped {item.error}", file=sys.stderr)
                    continue
                self._submit(self._restore(_ProblemState(item, ground_truth_answer(item.extra))))
            if not self._inflight:
                continue
            finished = self.llm.step()
            if not finished and not self.llm.has_unfinished():
                raise RuntimeError(
                    f"the engine has no unfinished requests but {len(self._inflight)} rounds never "
                    f"returned: {sorted(self._inflight)[:5]}"
                )
            for out in finished:
                state = self._inflight.pop(out.request_id, None)
                if state is not None:  # requests someone else added are not ours to handle
                    self._round_finished(state, out)
            self._progress.tick()
            every = self.cfg.checkpoint_every_s
            if every > 0 and time.monotonic() - self._last_snapshot >= every:
                self._snapshot()

    def _snapshot(self) -> None:
        """Save every round in flight (its trajectories' tokens so far) for --resume."""
        self._last_snapshot = time.monotonic()
        for request_id, state in self._inflight.items():
            try:
                partial = self.llm.partial_outputs(request_id)
            except KeyError:  # finished in the engine, its output not handled yet (a stop mid-step)
                continue
            if any(tokens for tokens, _ in partial):
                r = state.round_idx
                self._partials.save(state.problem.key, r + 1, self.schedule[r], self.cfg.seed, state.prompt,
                                    partial)

    def _submit(self, state: _ProblemState) -> None:
        """Build and add the engine request of ``state``'s current round."""
        r = state.round_idx
        k = self.schedule[r]
        problem = state.problem
        refs: list[str] | None = None
        state.dropped = 0
        if r > 0:
            # Already in reference order (_round_finished); empty responses are left out.
            refs = [t.message for t in state.rounds[-1] if t.passes_on]
            state.dropped = len(state.rounds[-1]) - len(refs)
        try:
            prompt = fit_round_prompt(
                self.llm.tokenizer,
                problem.messages,
                refs,
                max_model_len=self.max_model_len,
                max_tokens=self.max_tokens,
                message_token_cap=self.cfg.message_token_cap,
            )
            params = SamplingParams(
                n=k,
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                max_tokens=prompt.max_tokens,
                # Per problem and round, so results do not depend on what else was scheduled.
                seed=derive_seed(self.cfg.seed, problem.key, r, "sample"),
            )
            request_id = f"{problem.key}#r{r + 1}"
            state.prompt = prompt.token_ids
            state.resumed_tokens = self._add_request(state, params, request_id)
        except (PromptTooLong, ValueError) as e:
            # PromptTooLong is ours; ValueError is the engine refusing a prompt it can never fit.
            self._fail(state, f"round {r + 1}: {e}")
            return
        state.references = len(refs or [])
        state.truncated, state.truncated_tokens = prompt.truncated_messages, prompt.truncated_tokens
        self._inflight[request_id] = state

    def _add_request(self, state: _ProblemState, params: SamplingParams, request_id: str) -> int:
        """Add the round's request, continuing its snapshot if there is one; returns the tokens resumed."""
        r = state.round_idx
        resume = self._partials.load(state.problem.key, r + 1, params.n, self.cfg.seed, state.prompt)
        if resume is not None:
            try:
                self.llm.add_request(state.prompt, params, request_id=request_id, resume=resume)
                return sum(len(tokens) for tokens, _ in resume)
            except ValueError as e:
                print(f"pacore: problem {state.problem.id!r} round {r + 1}: snapshot not usable ({e}); "
                      f"starting the round over", file=sys.stderr)
        self.llm.add_request(state.prompt, params, request_id=request_id)
        return 0

    def _round_finished(self, state: _ProblemState, out) -> None:
        r = state.round_idx
        k = self.schedule[r]
        outputs = sorted(out.outputs, key=lambda c: c.index)
        trajectories = order_responses(
            [Trajectory(c.index, c.text, c.finish_reason, len(c.token_ids)) for c in outputs], self.cfg.shuffle,
            derive_seed(self.cfg.seed, state.problem.key, r + 1, "shuffle"))
        stats = round_stats_from_output(
            r + 1, k, out, references=state.references, dropped=state.dropped, truncated=state.truncated,
            truncated_tokens=state.truncated_tokens, resumed=state.resumed_tokens,
        )
        if self.cfg.grade:
            graded = [grade(t.message.strip(), state.gold) for t in trajectories]
            stats.answers = [a for a, _ in graded]  # in the recorded order, like round_responses
            flags = [ok for _, ok in graded if ok is not None]
            stats.accuracy = sum(flags) / len(flags) if flags else None
        state.rounds.append(trajectories)
        state.stats.append(stats)
        self.generated_tokens += stats.generated_tokens - state.resumed_tokens  # this session's work
        self._progress.round_done(len(outputs), stats.generated_tokens)
        if r + 1 < len(self.schedule):
            # A long round is not lost with a later one: resume continues from here.
            self._round_writer.write({"request_id": state.problem.id, "round": r + 1, "k": k,
                                      "seed": self.cfg.seed, "shuffle": self.cfg.shuffle,
                                      "responses": [t.to_record() for t in trajectories],
                                      "stats": stats.to_dict()})
            state.round_idx += 1
            self._submit(state)
        else:
            self._finish(state)
        self._partials.drop(state.problem.key, r + 1)  # only once the round is safely on disk

    def _restore(self, state: _ProblemState) -> _ProblemState:
        """Put back the rounds an earlier session finished, if they match this run's schedule and seed."""
        records = self._checkpoints.get(state.problem.key, [])[: len(self.schedule) - 1]
        if not records:
            return state
        if any((rec.get("k"), rec.get("seed"), rec.get("shuffle")) != (self.schedule[i], self.cfg.seed, self.cfg.shuffle)
               for i, rec in enumerate(records)):
            print(f"pacore: problem {state.problem.id!r}: its checkpointed rounds were run with another "
                  f"--rounds/--seed/--shuffle; starting it over", file=sys.stderr)
            return state
        for rec in records:
            state.rounds.append([Trajectory.from_record(t, i) for i, t in enumerate(rec["responses"])])
            state.stats.append(RoundStats(**rec["stats"]))
            self._progress.round_done(rec["k"], 0)
        state.round_idx = len(records)
        return state

    # -- records -----------------------------------------------------------------------------
    def _finish(self, state: _ProblemState) -> None:
        final = state.rounds[-1][0] if state.rounds[-1] else Trajectory(0, "")
        answer, correct = (None, None)
        if self.cfg.grade:
            answer, correct = grade(final.message.strip(), state.gold)
        sc_answer = majority_vote(state.stats[0].answers) if self.cfg.grade else None
        sc_correct = None
        if self.cfg.grade and state.gold is not None:
            sc_correct = sc_answer is not None and answers_equal(state.gold, sc_answer)
        record = {
            "request_id": state.problem.id,
            # The reference pipeline's keys, holding what it records under plain `vllm serve`.
            "final_response": final.text,
            "final_reasoning_content": "",
            "round_responses": [[t.to_record() for t in rnd] for rnd in state.rounds],
            "rounds_stats": [s.to_dict() for s in state.stats],
            "effective_compute_tokens": sum(s.generated_tokens for s in state.stats),
            "answer": answer,
            "correct": correct,
            "self_consistency": {"k": self.schedule[0], "answer": sc_answer, "correct": sc_correct},
        }
        self._write(record, state.problem.extra)

    def _fail(self, state: _ProblemState, error: str) -> None:
        print(f"pacore: problem {state.problem.id!r} failed: {error}", file=sys.stderr)
        self._progress.problem_failed(
            sum(self.schedule[state.round_idx:]), len(self.schedule) - state.round_idx
        )
        self._write_error(
            state.problem.id,
            error,
            state.problem.line_no,
            state.problem.extra,
            round_responses=[[t.to_record() for t in rnd] for rnd in state.rounds],
            rounds_stats=[s.to_dict() for s in state.stats],
        )

    def _write_error(self, pid, error: str, line_no: int, extra: dict, **partial) -> None:
        self._write({"request_id": pid, "error": error, "line": line_no, **partial}, extra)

    def _write(self, record: dict, extra: dict) -> None:
        for key, value in extra.items():
            record.setdefault(key, value)
        self._writer.write(record)


INTERRUPTED = ("pacore: interrupted; finished problems are saved in {out}. "
               "Run again with --resume to complete the rest.")


def pending_work(cfg: RunConfig) -> tuple[list[Problem | BadLine], dict[str, list[dict]]]:
    """The input lines not yet in the output, and the checkpointed rounds of those begun earlier."""
    prior = prepare_output(cfg.out_path, cfg.resume)
    todo, note = select_pending(read_problems(cfg.data_path), prior, cfg.skip_failed)
    if note:
        print(f"pacore: {note} ({cfg.out_path})", file=sys.stderr)
    return todo, read_round_checkpoints(cfg.out_path)


def profiled(llm, profile_dir: str | None):
    """A step-timeline and trace recorder around a run when profile_dir is set (bench.profile_run)."""
    if not profile_dir:
        return nullcontext()
    from bench.profile_run import ProfileSession

    return ProfileSession(llm, profile_dir)


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
