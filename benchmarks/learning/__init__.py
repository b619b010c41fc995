"""Learning benchmarks: what a run learns on a CPU in a fixed time or number of steps (reward curves per
objective, held-out arithmetic accuracy before and after, tool use)."""
