"""bench/gpu/step_times.py: a decode step split into host parts and the device's forward. The CUDA path
runs here with stand-in events (a host clock), so its arithmetic is checked before a GPU runs it."""
import time

import pytest
import torch

from bench.gpu.step_times import StepTimer, _TimedGraph
from engine import LLM, SamplingParams
from tiny_models import make_tiny_model


class ClockEvent:
    """torch.cuda.Event's surface, timed by the host clock."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return 1e3 * (end.t - self.t)


def test_cuda_path_splits_the_step_and_restores_the_runner(tmp_path, monkeypatch):
    folder = make_tiny_model(tmp_path / "m", "qwen3")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    with LLM(str(folder), device="cpu", record_steps=True, num_kv_blocks=64) as llm:
        timer = StepTimer(llm)
        timer.cuda, timer.event = True, ClockEvent
        with timer:
            llm.generate([[5, 6, 7, 8]], SamplingParams(n=2, max_tokens=6, ignore_eos=True), use_tqdm=False)
        assert not {"prepare", "prepare_draft", "execute"} & set(vars(llm.runner))  # the methods are back
        assert timer not in llm.observers
        out = timer.summary()
    step, forward = out["steps"]["decode"], out["forwards"]["decode"]
    assert step["steps"] == 5 and forward["calls"] == 5 and forward["rows"] == 2 and forward["graphs"] == 0
    assert 0 < step["gpu_ms"] <= step["model_ms"] and step["replay_ms"] == 0  # eager: no replay
    assert step["host_share"] == pytest.approx(1 - step["gpu_ms"] / step["wall_ms"])
    assert 0 < step["host_share"] < 1 and forward["gpu_ms"] == pytest.approx(step["gpu_ms"])


def test_a_graph_replay_is_bracketed_by_events():
    class Graph:
        replays = 0

        def replay(self):
            self.replays += 1

    timer = StepTimer.__new__(StepTimer)
    timer.current, timer.event = {}, ClockEvent
    graph = Graph()
    _TimedGraph(graph, timer).replay()
    [(start, end)] = timer.current["replays"]
    assert graph.replays == 1 and start.elapsed_time(end) >= 0
