"""Statistics of a collected batch: what both loops log of its rewards, lengths and tool calls."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def batch_metrics(batch: TensorDict) -> dict[str, float]:
    """Reward, component and length statistics of a collected batch."""
    out: dict[str, float] = {}
    reward = batch["reward"]
    out["reward_mean"] = float(reward.mean())
    out["reward_std"] = float(reward.std()) if reward.numel() > 1 else 0.0
    for key in batch.keys():
        if isinstance(key, str) and key.startswith("reward_"):
            out[f"{key}_mean"] = float(batch[key].float().mean())
    lengths = batch["response_mask"].sum(-1).float()
    out["response_length_mean"] = float(lengths.mean())
    out["response_length_max"] = float(lengths.max())
    out["truncated_fraction"] = float(batch["truncated"].float().mean())
    if "turns" in batch.keys():  # multi-turn episodes
        from grpo_rl.envs.multiturn import tool_metrics

        out.update(tool_metrics(batch))
    return out


def first_rows(group_id):
    """The distinct groups of ``group_id`` ``[N]`` and the index of each one's first row."""
    groups, inverse = torch.unique(group_id, return_inverse=True)
    first = torch.full((len(groups),), len(group_id), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(group_id)), "amin"
    )
    return groups.tolist(), first
