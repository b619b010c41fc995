"""grpo_rl: GRPO on verifiable rewards.

``from grpo_rl import Trainer`` builds a run from Python objects (:mod:`grpo_rl.api`); ``sota/grpo.py`` and
``sota/grpo-async.py`` run the same loops from the command line.
"""
from __future__ import annotations


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
