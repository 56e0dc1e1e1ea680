"""Cascade's prefix work plan at PaCoRe-8B's shapes (Qwen3-8B heads, H200's 132 SMs): a CUDA graph
captured at a padded bucket plans the same work as an eager call, and launches no empty programs."""
import torch

from engine.worker.cuda_graphs import pad_groups
from pacore_kernels.cascade_decode import cascade_prefix_plan

HQ, HKV, BLOCK_N, BS = 32, 8, 32, 16   # Qwen3-8B: 32 q heads, 8 kv heads, head_dim 128
TARGET = 2 * 132                       # fill_target on an H200


def _plan(groups: list[int], prefix: int, suffix: int, bucket: int | None):
    """Eager (bucket None: the real groups, max_group_size their largest) or graph (padded to the bucket,
    max_group_size = bucket, as engine/worker/cuda_graphs.py captures it)."""
    i32 = dict(dtype=torch.int32)
    starts = torch.tensor([0] + torch.tensor(groups).cumsum(0).tolist(), **i32)
    plens = torch.full((len(groups),), prefix, **i32)
    rows, largest = sum(groups), max(groups)
    if bucket is not None:
        starts, plens = pad_groups(starts, plens, rows, bucket)
        rows, largest = bucket, bucket
    max_tokens = -(-(prefix + suffix) // BS) * BS
    plan = cascade_prefix_plan(starts, plens, rows, HQ, HKV, largest, max_tokens, TARGET, BLOCK_N)
    items = int(plan.cum_items[-1])
    return dict(grid=plan.num_programs, items=items, busy=min(items, plan.num_programs),
                splits=plan.splits[:len(groups)].tolist(), slots=plan.max_splits)


def test_round2_shape_graph_splits_the_prefix_like_eager():
    # 4 trajectories sharing a 64k prefix (+1k each), in the 4-row bucket. The old bucket-sized
    # heuristic gave the graph 9 splits (72 CTAs on 132 SMs) where eager took 33.
    eager = _plan([4], 65536, 1024, None)
    graph = _plan([4], 65536, 1024, 4)
    assert eager == graph
    assert eager["splits"] == [33] and eager["items"] == 33 * HKV  # 64k / 33 = ~2k tokens per split
    assert 132 <= eager["busy"] <= TARGET                           # every SM has work, none has 3 items


def test_256_bucket_launches_no_grid_of_empty_programs():
    # Round 1: 8 problems x 30 trajectories sharing 512 tokens, padded to the 256 bucket (248 groups).
    # The old grid was G x member tiles x Hkv x splits = 256 x 16 x 8 x 1 = 32768 programs per layer.
    eager = _plan([30] * 8, 512, 16384, None)
    graph = _plan([30] * 8, 512, 16384, 256)
    assert eager["items"] == graph["items"] == 8 * 2 * HKV * 2  # groups x member tiles x heads x splits
    assert graph["splits"] == eager["splits"] == [2] * 8         # the 256-token floor: 512 = 2 splits
    assert graph["grid"] == eager["grid"] == TARGET
    assert graph["slots"] == eager["slots"] <= 34                # partial-state slots per row


def test_prefix_free_and_empty_groups_plan_no_work():
    starts, plens = pad_groups(torch.tensor([0, 3, 4], dtype=torch.int32),
                               torch.tensor([0, 32], dtype=torch.int32), 4, 8)
    assert starts.tolist() == [0, 3, 4, 5, 6, 7, 8, 8, 8] and plens.tolist() == [0, 32, 0, 0, 0, 0, 0, 0]
    plan = cascade_prefix_plan(starts, plens, 8, HQ, HKV, 8, 64, TARGET, BLOCK_N)
    assert plan.splits.tolist() == [0, 1, 0, 0, 0, 0, 0, 0]
    assert plan.query_splits.tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert int(plan.cum_items[-1]) == HKV
