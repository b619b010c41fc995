"""What the benchmark scripts share.

* ``runner``: :func:`~benchmarks.common.runner.run_script`, a run of ``sota/grpo.py`` or ``sota/grpo-async.py``
  in a subprocess, and the environment every such run gets;
* ``machine``: the CPU line every benchmark prints, and the process's memory (peak RSS, glibc's counts);
* ``workload``: ``versus_trl/trl_compare.py``'s workload, reward and worker line protocol (standard library only:
  TRL's worker imports it in ``benchmarks/.venv-trl``);
* ``stats``: intervals for the accuracies of the learning benchmarks.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"  # gitignored
