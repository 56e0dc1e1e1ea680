"""Data parallelism: engine replicas fed problems by one driver that alone writes the results.

driver.py (hands out problems, replays the replicas' events on the results files, reassigns a lost
replica's problems), worker.py (one replica's side: a runner whose output goes back to the driver),
processes.py (replicas as local processes on pipes, ``--data-parallel``), ray_actors.py (replicas as
Ray actors, ``--ray``).
"""
