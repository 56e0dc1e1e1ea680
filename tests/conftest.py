import os
import sys
from pathlib import Path

import pytest

# One torch thread per process, before torch is imported (here, and in every process a test spawns: TP
# workers, servers, replicas). The tests' tensors are small, and with two OpenMP threads on two cores
# that a spawned process also wants, a thread spin-waits for a partner that is not scheduled: measured
# 10x slower on this suite's engine tests (266 s against 28 s for test_spec_decode + test_logprobs).
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).parent))

# Before any test module imports triton (engine/worker/model.py pulls in kernels, hence triton): on a CPU
# host the Triton interpreter must be chosen before triton's own @jit functions are created.
import _triton_env  # noqa: E402,F401

from tiny_models import make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """kind -> folder of a tiny random checkpoint written by transformers (made once)."""
    root = tmp_path_factory.mktemp("tiny_models")
    made = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = make_tiny_model(root / kind, kind)
        return made[kind]
    return get


@pytest.fixture(scope="session")
def plain_samples(tiny_model_dir):
    """20,000 five-token trajectories of the peaked tiny Qwen3 from one prompt, without speculation: the
    distribution every speculative rule must keep (tests/engine/test_spec_*.py), sampled once."""
    from spec_samples import samples
    return samples(tiny_model_dir("qwen3_sharp"), None)[0]
