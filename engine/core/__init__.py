"""The scheduling core: sequences, the scheduler and its plan, KV blocks, stopping, checks, step errors and observers."""
