"""System benchmarks: whole runs and steps of ``sota/grpo.py`` and ``sota/grpo-async.py`` (where a step's time and
memory go, synchronous against asynchronous, the pipeline at scale, a served engine, a busy neighbour, workers
killed, the size and open time of a long run's report)."""
