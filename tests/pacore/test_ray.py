"""pacore run --ray: replicas as Ray actors of a local Ray cluster, 2 CPU replicas of a tiny model.

Seeded and batch-invariant, so a problem's tokens do not depend on which replica ran it, what ran
beside it, or a replica dying under it: every run must give the same records as one engine (run here,
on the one thread each replica has). An actor takes ~8 s to start on this 2-core VM, hence few runs."""
import dataclasses
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch

from pacore.cli import build_llm, build_parser, main
from pacore.config import RunConfig
from pacore.results.files import read_results
from pacore.runner import PaCoReRunner
from pacore.results.files import summary_path
from test_pacore_parallel import _comparable, _problems

ray = pytest.importorskip("ray")

from pacore.replicas.ray_actors import run_on_ray  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    # 2 CPUs: each of the 2 replicas asks for one and runs one torch thread
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def setup(cluster, tiny_model_dir, tmp_path_factory):
    """The run's config (each test gives its own --out) and the records of one engine."""
    root = tmp_path_factory.mktemp("ray")
    _problems(root / "in.jsonl", 6)
    cfg = RunConfig(data_path=str(root / "in.jsonl"), out_path="", rounds=(2,), max_tokens=8, seed=3,
                    max_problems_in_flight=1, show_progress=False, checkpoint_every_s=1e-6,
                    engine_options={"model": str(tiny_model_dir("qwen3")), "num_kv_blocks": 256,
                                    "batch_invariant": True})
    one = dataclasses.replace(cfg, out_path=str(root / "one.jsonl"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a replica runs: batch invariance holds for one thread count
    try:
        PaCoReRunner(build_llm(one), one).run()
    finally:
        torch.set_num_threads(threads)
    return cfg, root, _comparable(one.out_path)


def _keys(path):
    return sorted((r["request_id"], r.get("run", 0)) for r in read_results(path) if "error" not in r)


ALL = [(f"p{i}", 0) for i in range(6)]


def test_two_replicas_give_the_records_of_one_engine(setup, capsys):
    cfg, root, expected = setup
    out = root / "two.jsonl"
    args = ["run", "--model", cfg.engine_options["model"], "--data", cfg.data_path, "--out", str(out),
            "--rounds", "2", "--max-tokens", "8", "--seed", "3", "--num-kv-blocks", "256", "--batch-invariant",
            "--max-problems-in-flight", "1", "--no-progress", "--ray", "--data-parallel", "2"]
    assert main(args) == 0  # the cluster this module started is used as it is
    assert _keys(out) == ALL  # every problem exactly once
    assert _comparable(str(out)) == expected
    summary = json.load(open(summary_path(str(out))))
    assert sum(summary["run"]["dispatch"]["problems_per_replica"]) == 6
    assert "on 2 replicas" in capsys.readouterr().out


def test_a_killed_actor_s_problems_finish_on_the_other(setup):
    cfg, root, expected = setup
    run = dataclasses.replace(cfg, out_path=str(root / "killed.jsonl"))
    killed = []

    def kill_after_first_record(replicas, rank, reply):
        if not killed and any(name == "record" for name, _ in reply.events):
            killed.append(rank)
            ray.kill(replicas.actors[rank])
    summary = run_on_ray(run, build_llm, replicas=2, on_reply=kill_after_first_record)
    assert _keys(run.out_path) == ALL
    assert _comparable(run.out_path) == expected  # continued from the driver's checkpoints and snapshots
    dispatch = summary["run"]["dispatch"]
    assert list(dispatch["lost"]) == [str(killed[0])] and "ray.kill" in dispatch["lost"][str(killed[0])]
    assert dispatch["problems_reassigned"] >= 1


class _Cluster:
    """What _placement reads of Ray: the cluster's resources and its nodes."""

    def __init__(self, gpus=0, cpus=0, nodes=1):
        self.resources, self.alive = {"GPU": gpus, "CPU": cpus}, nodes

    def cluster_resources(self):
        return {k: v for k, v in self.resources.items() if v}

    def nodes(self):
        per_node = {k: v / self.alive for k, v in self.resources.items() if v}
        return [{"Alive": True, "Resources": per_node}] * self.alive + [{"Alive": False, "Resources": {"GPU": 8}}]


def test_ray_placement_counts_replicas_and_refuses_what_the_cluster_lacks():
    from pacore.replicas.ray_actors import _placement

    assert _placement(_Cluster(gpus=8, cpus=64), None, 2) == (4, {"num_gpus": 2, "num_cpus": 1}, 0)  # GPUs // T
    assert _placement(_Cluster(gpus=8, cpus=64), 3, 2)[0] == 3
    with pytest.raises(ValueError, match=r"need 10 GPUs, 2 on one node each, but the Ray cluster's nodes have \[8\]"):
        _placement(_Cluster(gpus=8, cpus=64), 5, 2)
    # 4 nodes of 2 GPUs: 8 GPUs, but a replica of 4 fits on none of them (it would wait forever)
    with pytest.raises(ValueError, match=r"nodes have \[2, 2, 2, 2\] GPUs \(0 such replicas fit\)"):
        _placement(_Cluster(gpus=8, cpus=64, nodes=4), None, 4)
    assert _placement(_Cluster(gpus=8, cpus=64, nodes=4), None, 2)[0] == 4
    # no GPUs: one replica per live node, splitting the cluster's CPUs, spread over the nodes
    assert _placement(_Cluster(cpus=16, nodes=2), None, 1) == (2, {"num_gpus": 0, "num_cpus": 8,
                                                                   "scheduling_strategy": "SPREAD"}, 8)
    with pytest.raises(ValueError, match="3 CPU replicas need 3 CPUs but the Ray cluster has 2"):
        _placement(_Cluster(cpus=2), 3, 1)


def test_ray_flags_are_documented_and_a_missing_ray_is_named(tmp_path, monkeypatch, capsys):
    parser = build_parser()
    run_help = parser._subparsers._group_actions[0].choices["run"].format_help()
    for flag in ("--ray [ADDRESS]", "--data-parallel D", "--tensor-parallel T"):
        assert flag in run_help
    page = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    section = page.split("## Commands", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("pacore ", 1)[1] for line in section.splitlines() if line.startswith(".venv/bin/pacore ")]
    assert len(commands) == 4
    for command in commands:  # every command of the docs' section parses
        parser.parse_args(shlex.split(command))
    _problems(tmp_path / "in.jsonl", 1)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    assert main(["run", "--data", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl"), "--ray"]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err
