"""bench/gpu/engine_check.py's comparison: logits within a tolerance, tokens except flips the logits explain."""
import torch

from bench.gpu.engine_check import compare


def _traj(tokens, rows):
    return tokens, [torch.tensor(r, dtype=torch.float32) for r in rows]


def test_identical_runs_pass():
    ref = {("0", 0): _traj([1, 2], [[0.0, 5.0, 1.0], [0.0, 1.0, 6.0]])}
    r = compare(ref, ref, tol=1e-3, greedy=True)
    assert r["passed"] and r["identical"] == 1 and r["max_rel_logit_diff"] == 0


def test_a_greedy_flip_passes_only_where_the_top2_margin_is_within_the_logit_difference():
    ref = {("0", 0): _traj([1, 1, 0], [[0.0, 5.0, 1.0], [0.0, 3.000, 2.999], [9.0, 0.0, 0.0]])}
    near = {("0", 0): _traj([1, 2, 2], [[0.0, 5.0, 1.0], [0.0, 2.9995, 3.0], [0.0, 0.0, 9.0]])}
    r = compare(ref, near, tol=1e-3, greedy=True)  # margin 0.001 <= 2 x 0.001: explained; later steps differ
    assert r["passed"] and r["explained_flips"] == 1 and r["identical"] == 0
    ref2 = {("0", 0): _traj([1, 1], [[0.0, 5.0, 1.0], [0.0, 3.0, 2.0]])}
    clear = {("0", 0): _traj([1, 2], [[0.0, 5.0, 1.0], [0.0, 3.0, 2.0]])}
    r = compare(ref2, clear, tol=1e-3, greedy=True)  # same logits, another token: a bug
    assert not r["passed"] and r["unexplained"]


def test_logits_beyond_the_tolerance_fail_even_with_equal_tokens():
    ref = {("0", 0): _traj([1], [[0.0, 5.0, 1.0]])}
    off = {("0", 0): _traj([1], [[0.0, 5.0, 1.2]])}
    r = compare(ref, off, tol=1e-2, greedy=True)
    assert not r["passed"] and r["max_rel_logit_diff"] > 1e-2 and not r["unexplained"]


def test_a_seeded_draw_may_flip_only_where_the_logits_differ():
    ref = {("0", 0): _traj([1], [[0.0, 1.0, 1.0]])}
    assert not compare(ref, {("0", 0): _traj([2], [[0.0, 1.0, 1.0]])}, tol=1e-3, greedy=False)["passed"]
    assert compare(ref, {("0", 0): _traj([2], [[0.0, 1.0, 1.0001]])}, tol=1e-3, greedy=False)["passed"]
