"""Problems in, results out, and resume: everything a run reads from or writes to disk.

problems.py (the input file), keys.py (every key and name on disk, one module), files.py (the files
beside a results file; durable appends), lock.py (one run per results file), resume.py (what earlier
sessions left and what is still to do), snapshots.py (the trajectories of rounds in flight),
sink.py (where a runner's output goes: the files, or the driver of a replicated run), journal.py (a
runner's record of its work: results, checkpoints, snapshots, and what it restores), settings.py (the
settings a resume must match), preflight.py (the one check before a run, in one pass: the flags, every
file the run touches, what is there, the settings compared, what is left to do).
"""
