"""Benchmark scripts, by kind: ``micro/``, ``system/``, ``learning/``, ``versus_trl/``; ``common/`` is what they share.

Each script runs as ``python benchmarks/<kind>/<name>.py`` and first puts the repository on ``sys.path``, so that
``benchmarks.common`` and the source tree's ``grpo_rl`` import from wherever it is started. See README.md.
"""
