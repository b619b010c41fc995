"""DAPO's dynamic sampling: a step trains on ``env.prompts_per_step`` groups whose rewards vary.

A group whose answers all got the same reward has zero advantage everywhere and carries no gradient; dropping it
(``policy.filter_zero_variance_groups``) leaves the step with fewer groups, and fewer still as the model gets
better or worse at everything. DAPO (Yu et al., 2025, section 3.2) instead keeps sampling. Here the unit is the group:
with ``policy.dynamic_sampling=true`` a group whose task reward (``reward``, before any length shaping or KL) is the
same for every answer is dropped the moment it finishes and the next prompt of the stream starts in its place at once
(slime's filter applied as each group completes), in both loops: the synchronous loop's source keeps ``P`` groups in
flight and replaces the flat ones (:class:`~grpo_rl.rollout.source.InProcessRollouts`); in the asynchronous loop the
collectors' buffer drops a flat group when it is put and releases its admission, so a collector starts another
(:class:`~grpo_rl.distributed.buffer.RolloutBuffer`). A step may draw at most
``(1 + policy.dynamic_sampling_max_rounds) * P`` groups (verl's ``max_num_gen_batches``, counted in groups); when
that bound is reached first, the step trains on the varied groups it has (``dynamic_sampling_short`` is 1), and on
none if there are none (the first flat groups, which the zero-variance filter then drops: the update is skipped).
Dynamic sampling implies the zero-variance filter.

Every group drawn is consumed (trained on, or dropped), so the stream position and a resumed run stay exactly once.

Logged every step: ``sampling_rounds`` (groups drawn / ``P``), ``dynamic_sampling_groups`` (varied groups trained),
``dynamic_sampling_dropped_groups`` (flat groups), ``dynamic_sampling_short``. ``reward_mean`` and the other reward
statistics are those of every answer sampled for the step, so runs with and without dynamic sampling log comparable
rewards; ``reward_mean_trained`` is the mean over the answers trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from grpo_rl.engines.base import concat_batches
from grpo_rl.rollout.stats import batch_metrics


def varied_groups(batch: TensorDict) -> torch.Tensor:
    """``[N]`` bool: rows whose group's task rewards are not all equal."""
    reward, group = batch["reward"], batch["group_id"]
    groups, inverse = torch.unique(group, return_inverse=True)
    lo = torch.full((len(groups),), float("inf")).scatter_reduce(0, inverse, reward.float(), "amin")
    hi = torch.full((len(groups),), float("-inf")).scatter_reduce(0, inverse, reward.float(), "amax")
    return (hi > lo)[inverse]


@dataclass(frozen=True)
class DynamicSampling:
    """The rule: ``groups`` (``P``) varied groups a step, at most ``max_extra_rounds * P`` groups drawn beyond ``P``."""

    groups: int
    max_extra_rounds: int

    @property
    def max_draws(self) -> int:
        return (1 + self.max_extra_rounds) * self.groups

    @staticmethod
    def keep(group: TensorDict) -> bool:
        """Whether a finished group's rewards vary."""
        return bool(varied_groups(group).any())

    def step_batch(self, kept: list[TensorDict], flat: list[TensorDict], pad_id: int) -> tuple[TensorDict, dict]:
        """The step's batch from the varied groups ``kept`` and the ``flat`` ones drawn for it (each a group, in
        the order trained), and the metrics of the module docstring."""
        batch = concat_batches(kept[: self.groups] or flat[: self.groups], pad_id)
        return batch, self.metrics(batch, flat, pad_id)

    def metrics(self, batch: TensorDict, flat: list[TensorDict], pad_id: int) -> dict[str, float]:
        """The module docstring's metrics of a step that trains on ``batch`` (its varied groups, or the first flat
        ones when none varied) after dropping the groups ``flat``."""
        varied = self.keep(batch)
        num_kept = len(torch.unique(batch["group_id"])) if varied else 0
        every = concat_batches(([batch] if varied else []) + flat, pad_id)
        drawn = num_kept + len(flat)
        out = {k: v for k, v in batch_metrics(every).items() if k.startswith("reward")}
        out.update(
            sampling_rounds=drawn / self.groups,
            dynamic_sampling_groups=float(num_kept),
            dynamic_sampling_dropped_groups=float(len(flat)),
            dynamic_sampling_short=float(num_kept < self.groups),
            reward_mean_trained=float(batch["reward"].mean()) if varied else float("nan"),
        )
        return out
