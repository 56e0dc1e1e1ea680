"""The paper's evaluation: independent runs and the round-1 pool they draw from (runs.py), answer
extraction and grading (grading.py), the results record of a run (records.py), per-round statistics
(stats.py), trajectory confidence and how it relates to correctness (confidence.py) and the run summary over the whole results file (summary.py)."""
