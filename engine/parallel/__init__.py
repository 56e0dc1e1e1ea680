"""Tensor parallelism: the checkpoint slice of each rank, its process group, and child processes on this machine."""
