"""What the benchmark scripts share.

* ``machine``: the CPU and the process's memory (peak RSS, glibc's counts);
* ``workload``: ``versus_trl/trl_compare.py``'s workload, reward and worker line protocol (standard library only:
  TRL's worker imports it in ``benchmarks/.venv-trl``);
* ``stats``: intervals for the accuracies of the learning benchmarks.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"  # gitignored
