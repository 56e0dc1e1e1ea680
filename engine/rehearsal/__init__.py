"""Rehearsal: the real engine and PaCoRe loop at a real model's size, with the device modelled.

Everything but the model's arithmetic runs as it would on a GPU: the scheduler, the block manager
with the real block count, the prefix cache, fork, preemption, ``ModelRunner.prepare``, stop checks
and the PaCoRe runner. The forward pass and sampling are replaced behind the model runner
(``LLM(..., device_model="h200")``): no weights and no KV tensor are allocated, a virtual clock
advances by each step's modelled cost (engine/device_model.py), and the sampled tokens follow a workload of
trajectory lengths (runner.py).
"""
