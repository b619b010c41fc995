"""Group-relative advantages (GRPO, Shao et al., 2024, sec. 4.1.2 "outcome supervision").

Each prompt is answered ``G`` times; an answer's advantage is its reward minus the mean reward of its
group, optionally divided by the group's standard deviation. Groups whose rewards are all equal carry no
learning signal: they are counted, and can be filtered out (DAPO's "dynamic sampling" without resampling).

Departure from the paper: the std is the unbiased sample std (as TRL computes it); ``scale_by_std=False``
gives Dr. GRPO's unscaled advantages (Liu et al., 2025).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GroupAdvantages:
    """Advantages and group statistics for a batch of ``N = num_groups * G`` answers.

    Attributes:
        advantage: ``[N]`` per-answer advantage.
        group_mean: ``[N]`` mean reward of each answer's group.
        group_std: ``[N]`` reward std of each answer's group.
        zero_variance: ``[N]`` bool, True where the answer's group has identical rewards.
        num_zero_variance_groups: number of groups with identical rewards.
    """

    advantage: torch.Tensor
    group_mean: torch.Tensor
    group_std: torch.Tensor
    zero_variance: torch.Tensor
    num_zero_variance_groups: int


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6
) -> GroupAdvantages:
    """Compute group-relative advantages for consecutive groups of ``group_size`` answers.

    Args:
        rewards: ``[N]`` rewards, where answers ``i*G .. (i+1)*G - 1`` belong to prompt ``i``.
        group_size: ``G``; must divide ``N``.
        scale_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
        eps: added to the std to avoid division by zero.

    Returns:
        :class:`GroupAdvantages`.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    n = rewards.numel()
    if group_size < 1 or n % group_size:
        raise ValueError(f"group_size={group_size} must divide the number of rewards ({n})")
    rewards_GK = rewards.float().view(-1, group_size)  # [num_groups, G]
    mean_G = rewards_GK.mean(-1, keepdim=True)  # [num_groups, 1]
    std_G = rewards_GK.std(-1, keepdim=True, unbiased=True) if group_size > 1 else torch.zeros_like(mean_G)
    adv_GK = rewards_GK - mean_G
    if scale_by_std:
        adv_GK = adv_GK / (std_G + eps)
    zero_var_G = (rewards_GK.max(-1, keepdim=True).values - rewards_GK.min(-1, keepdim=True).values) == 0
    return GroupAdvantages(
        advantage=adv_GK.reshape(n),
        group_mean=mean_G.expand_as(rewards_GK).reshape(n),
        group_std=std_G.expand_as(rewards_GK).reshape(n),
        zero_variance=zero_var_G.expand_as(rewards_GK).reshape(n),
        num_zero_variance_groups=int(zero_var_G.sum()),
    )
