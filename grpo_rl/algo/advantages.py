"""Group-relative advantages (GRPO, Shao et al., 2024, sec. 4.1.2 "outcome supervision").

Each prompt is answered ``G`` times; an answer's advantage is its reward minus the mean reward of its
group, optionally divided by the group's standard deviation. Groups whose rewards are all equal carry no
learning signal: they are counted, and can be filtered out (DAPO's "dynamic sampling" without resampling).

A group is defined by ``group_id`` ``[N]`` alone (set by the engine, :func:`grpo_rl.engines.base.pack_rollouts`):
the rows that share an id are one group, wherever they sit in the batch and however many there are. Row
positions are never used, so a batch from which a filter removed whole groups, or whose groups differ in size,
gets the same advantages as a loop over its groups.

Departures from the paper: the std is the unbiased sample std (as TRL computes it); ``scale_by_std=False``
gives Dr. GRPO's unscaled advantages (Liu et al., 2025). A group of one answer has std 0 and advantage 0.

The std gets ``eps`` added before dividing (``policy.advantage_eps``, default 1e-6); TRL adds 1e-4. The two
differ only for groups whose std is not far above ``eps``: with 0/1 correctness rewards the smallest non-zero
std of a group of G answers is ``1/sqrt(G)`` (0.35 at G = 8), where the choice moves advantages by under 0.03%,
and a group of equal rewards gets advantage 0 either way. Where rewards
are continuous (a reward model, KL in the reward) and a group's answers score almost alike, 1e-4 damps
differences below about 1e-4 towards 0, while 1e-6 scales them up to unit size. The default stays 1e-6: it is
the value every earlier run of this library used, so results stay comparable, and it is the closer of the two to
the paper's plain ``(r - mean) / std``; set ``policy.advantage_eps=1e-4`` to reproduce TRL.

Reward shaping (:func:`assign_advantages`) changes only what the advantages see; ``reward`` stays the task reward.
With KL in the reward the advantage is computed from the reward minus the summed KL to the reference. DAPO's soft
overlong punishment (:mod:`grpo_rl.algo.overlong`) is added likewise and kept as ``reward_overlong``. Its overlong
filter drops ``truncated`` answers after the advantages (so they still count in their group's mean and std) and
after the zero-variance filter, which keeps or drops whole groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from grpo_rl.algo.loss import KLEstimator, kl_estimate
from grpo_rl.algo.overlong import overlong_reward


@dataclass
class GroupAdvantages:
    """Advantages and group statistics for a batch of ``N`` answers in ``num_groups`` groups."""

    advantage: torch.Tensor  # [N]
    group_mean: torch.Tensor  # [N] mean reward of each answer's group
    group_std: torch.Tensor  # [N] reward std of each answer's group (0 for a group of one)
    zero_variance: torch.Tensor  # [N] bool: the answer's group has identical rewards (a group of one included)
    num_zero_variance_groups: int
    num_groups: int  # distinct group_id values


def group_advantages(
    rewards: torch.Tensor, group_id: torch.Tensor, *, scale_by_std: bool = True, eps: float = 1e-6
) -> GroupAdvantages:
    """Group-relative advantages of ``rewards`` ``[N]``, one group per distinct integer ``group_id`` ``[N]``;
    ``scale_by_std``: divide by the group std plus ``eps`` (GRPO) or not (Dr. GRPO)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_id.shape != rewards.shape or group_id.is_floating_point() or group_id.is_complex():
        raise ValueError(
            f"group_id must be an integer tensor of the rewards' shape {tuple(rewards.shape)}, "
            f"got {group_id.dtype} {tuple(group_id.shape)}"
        )
    rewards_N = rewards.float()  # [N]
    _, group_N = torch.unique(group_id, return_inverse=True)  # [N] dense group index in 0..K-1
    k = int(group_N.max()) + 1 if group_N.numel() else 0
    count_K = torch.bincount(group_N, minlength=k).to(rewards_N.dtype)  # [K]
    zeros_K = rewards_N.new_zeros(k)
    mean_K = zeros_K.index_add(0, group_N, rewards_N) / count_K  # [K]
    centred_N = rewards_N - mean_K[group_N]  # [N]
    # Unbiased std, two-pass like torch.std; a group of one has a zero sum of squares, hence std 0.
    var_K = zeros_K.index_add(0, group_N, centred_N.square()) / (count_K - 1).clamp(min=1)  # [K]
    std_K = var_K.sqrt()  # [K]
    adv_N = centred_N / (std_K[group_N] + eps) if scale_by_std else centred_N
    max_K = zeros_K.scatter_reduce(0, group_N, rewards_N, "amax", include_self=False)  # [K]
    min_K = zeros_K.scatter_reduce(0, group_N, rewards_N, "amin", include_self=False)  # [K]
    zero_var_K = max_K == min_K  # [K]
    return GroupAdvantages(
        advantage=adv_N,
        group_mean=mean_K[group_N],
        group_std=std_K[group_N],
        zero_variance=zero_var_K[group_N],
        num_zero_variance_groups=int(zero_var_K.sum()),
        num_groups=k,
    )


def assign_advantages(
    batch: TensorDict,
    *,
    scale_by_std: bool = True,
    advantage_eps: float = 1e-6,
    kl_in_reward_coef: float = 0.0,
    kl_estimator: str = "k1",
    filter_zero_variance: bool = False,
    overlong_buffer: int = 0,
    overlong_penalty: float = 1.0,
    max_tokens: int | None = None,
    filter_overlong: bool = False,
) -> tuple[TensorDict, dict[str, float]]:
    """Add ``advantage`` and ``zero_variance`` to ``batch``, optionally dropping zero-variance groups and
    truncated answers (order and reward shaping: the module docstring); returns the batch and its statistics.
    ``kl_in_reward_coef > 0`` needs ``ref_logprobs``; ``overlong_buffer > 0`` needs ``max_tokens`` (``L_max``)."""
    rewards = batch["reward"]
    if overlong_buffer > 0:
        if max_tokens is None:
            raise ValueError("overlong_buffer > 0 needs max_tokens (sampling.max_new_tokens)")
        shaping_N = overlong_reward(
            batch["response_mask"].sum(-1), max_tokens=max_tokens, buffer=overlong_buffer, penalty=overlong_penalty
        )  # [N]
        batch.set("reward_overlong", shaping_N)
        rewards = rewards + shaping_N
    if kl_in_reward_coef > 0:
        rewards = kl_penalised_rewards(
            rewards,
            batch["behavior_logprobs"],
            batch["ref_logprobs"],
            batch["response_mask"],
            kl_coef=kl_in_reward_coef,
            estimator=kl_estimator,
        )
    adv = group_advantages(rewards, batch["group_id"], scale_by_std=scale_by_std, eps=advantage_eps)
    batch.set("advantage", adv.advantage)
    batch.set("zero_variance", adv.zero_variance)
    stats = {
        "advantage_mean": float(adv.advantage.mean()),
        "advantage_std": float(adv.advantage.std()) if adv.advantage.numel() > 1 else 0.0,
        "advantage_abs_max": float(adv.advantage.abs().max()),
        "zero_variance_groups": float(adv.num_zero_variance_groups),
        "zero_variance_fraction": adv.num_zero_variance_groups / max(1, adv.num_groups),
    }
    if overlong_buffer > 0:
        stats["reward_overlong_mean"] = float(batch["reward_overlong"].mean())
    if filter_zero_variance:
        batch = batch[~adv.zero_variance]
    if filter_overlong:
        truncated_N = batch["truncated"]  # [N'] bool
        stats["overlong_filtered"] = float(truncated_N.sum())
        batch = batch[~truncated_N]  # after the advantages: they still counted in their group's mean and std
    return batch, stats


def kl_penalised_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_coef: float,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """``rewards`` ``[B]`` less ``kl_coef`` times each answer's summed KL estimate ("KL in reward"), ``[B]``;
    ``logprobs`` (the sampling policy's), ``ref_logprobs`` and ``mask`` are ``[B, T]``."""
    kl_B = (kl_estimate(logprobs, ref_logprobs, estimator) * mask.to(logprobs.dtype)).sum(-1)  # [B]
    return rewards - kl_coef * kl_B
