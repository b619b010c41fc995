"""grpo_rl: GRPO on verifiable rewards.

``from grpo_rl import Trainer`` builds a run from Python objects (:mod:`grpo_rl.api`); ``sota/grpo.py`` and
``sota/grpo-async.py`` run the same loops from the command line.
"""
from __future__ import annotations

import os as _os

# OpenMP reads its environment once, when torch loads it, so this runs before anything imports torch. The GNU
# runtime's default lets a thread that reaches a barrier spin for a while before it sleeps; with a second busy
# process on the cores (a browser, another job, or our own engine and learner processes on a CPU box) the spinning
# threads take the time slices the late thread needs, and steps ran 2.35-2.9x slower than idle
# (benchmarks/neighbour_step.py). Sleeping at barriers kept that to 1.35-1.9x at the same idle speed. An
# OMP_WAIT_POLICY of the user's (ACTIVE to spin) is kept; so is any setting when torch was imported first.
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
for _key, _value in OPENMP_DEFAULTS.items():
    _os.environ.setdefault(_key, _value)


def __getattr__(name: str):
    # The API pulls in torch, transformers and Hydra: imported on first use, so `import grpo_rl.x` stays light.
    if name in ("Trainer", "RunResult", "train", "compose"):
        from grpo_rl import api

        return getattr(api, name)
    if name == "RewardFunction":
        from grpo_rl.rewards.custom import RewardFunction

        return RewardFunction
    raise AttributeError(f"module 'grpo_rl' has no attribute {name!r}")


__all__ = ["RewardFunction", "RunResult", "Trainer", "compose", "train"]
