"""Micro-benchmarks: one kernel, component or quantity timed alone (matmul rates, the LM head, the optimizer step,
weight transport, oneDNN's caches, a checkpoint's manifest, the environment, the truncated importance ratio)."""
