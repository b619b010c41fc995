"""grpo_rl: GRPO on verifiable rewards.

``from grpo_rl import Trainer`` builds a run from Python objects (:mod:`grpo_rl.api`); ``sota/grpo.py`` and
``sota/grpo-async.py`` run the same loops from the command line.
"""

from __future__ import annotations

import os as _os

# OpenMP reads its environment once, when torch loads it, so this runs before anything imports torch. The GNU
# runtime's default lets a thread that reaches a barrier spin for a while before it sleeps; with a second busy
# process on the cores (a browser, another job, or our own engine and learner processes on a CPU box) the spinning
# threads take the time slices the late thread needs. Sleeping at barriers keeps the idle speed and most of the
# busy one (measured; see benchmarks/system/neighbour_step.py and benchmarks/micro/busy_neighbour.py). An
# OMP_WAIT_POLICY of the user's (ACTIVE to spin) is kept; so is any setting when torch was imported first.
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}

# oneDNN, which runs torch's bf16 (and autocast) matmuls on the CPU, keeps every kernel it builds in two caches of
# 1024 entries each, ideep's (LRU_CACHE_CAPACITY) and its own. A new token count is a new shape, so with the varying
# lengths of RL batches the caches only fill, and then fragment the heap as they evict: a run's memory kept growing.
# Building a kernel is cheap next to running it, so 64 entries keep memory flat at the same speed (measured; see
# benchmarks/micro/onednn_cache.py). Read when oneDNN builds its first kernel; a user's value is kept.
ONEDNN_DEFAULTS = {"LRU_CACHE_CAPACITY": "64", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
for _key, _value in {**OPENMP_DEFAULTS, **ONEDNN_DEFAULTS}.items():
    _os.environ.setdefault(_key, _value)


# The Python API, imported here so that ``from grpo_rl import Trainer`` works; it loads torch, TensorDict and Hydra
# (about 5 s on a 2-core CPU), after the defaults above are in the environment.
from grpo_rl.api import RunResult, Trainer, compose, train  # noqa: E402
from grpo_rl.envs.rewards.custom import RewardFunction  # noqa: E402

__all__ = ["RewardFunction", "RunResult", "Trainer", "compose", "train"]
