"""DAPO's two treatments of answers that run into the length limit (Yu et al., 2025, "DAPO", sec. 3.4,
"Overlong Reward Shaping").

Both act in the advantage stage (:func:`grpo_rl.algo.advantages.assign_advantages`), before the learner:

* Soft overlong punishment (``policy.overlong_buffer > 0``): with ``L_max = sampling.max_new_tokens`` and a buffer
  ``L_cache``, an answer of ``|y|`` tokens gets the extra reward

  ==========================================  ==================================
  ``|y| <= L_max - L_cache``                  ``0``
  ``L_max - L_cache < |y| <= L_max``          ``(L_max - L_cache - |y|) / L_cache``
  ``|y| > L_max``                             ``-1``
  ==========================================  ==================================

  times ``policy.overlong_penalty`` (1 in the paper; verl's ``overlong_penalty_factor``). It is added to the task
  reward before the group advantages, so it shapes them like any reward component. ``|y|`` is
  ``response_mask.sum(-1)``: the answer's tokens, the end-of-sequence token included, as the engine counts them
  against ``max_new_tokens``. The engine never returns more than ``L_max`` tokens, so the ``-1`` branch only
  matters for batches built elsewhere; an answer of exactly ``L_max`` tokens already gets ``-1`` from the
  linear ramp.

* Overlong filtering (``policy.overlong_filter``): answers that stopped at the length limit (``truncated``) are
  left out of the policy loss, so their tokens add nothing to it or to its gradient, while they still count in
  their group's mean and std (the advantages are computed first, over every answer). They are removed from the
  batch the learner trains on, as the zero-variance filter removes groups, which also saves their forward and
  backward passes. The loss's denominator is therefore what DAPO's masked loss divides by: under ``token_mean`` the
  tokens of the answers that were kept (TRL's ``mask_truncated_completions`` zeroes the truncated rows of the
  completion mask, which drops them from its token count alike); under the per-sequence aggregations the answers
  that were kept.

Departures: the paper's piecewise function is computed as ``clamp((L_max - L_cache - |y|) / L_cache, -1, 0)``,
which is the same function; verl applies the linear ramp beyond ``L_max`` without the ``-1`` floor. TRL's
per-sequence ``loss_type=grpo`` keeps a masked answer in its row count (it contributes 0 and still divides the
mean); here a filtered answer is not counted. In both treatments ``reward`` stays the task reward (as with
``policy.kl_in_reward``): the shaping is kept as ``reward_overlong`` and logged as ``reward_overlong_mean``.
"""

from __future__ import annotations

import torch


def overlong_reward(lengths: torch.Tensor, *, max_tokens: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment ``[N]``, in ``[-penalty, 0]``, of answers of ``lengths`` ``[N]`` tokens;
    ``max_tokens`` is ``L_max``, ``buffer`` is ``L_cache`` (0: off)."""
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D [N], got shape {tuple(lengths.shape)}")
    if buffer < 0 or buffer >= max_tokens:
        raise ValueError(f"buffer={buffer} must be in [0, max_tokens={max_tokens})")
    lengths_N = lengths.float()  # [N]
    if buffer == 0:
        return torch.zeros_like(lengths_N)
    ramp_N = (max_tokens - buffer - lengths_N) / buffer  # [N]: > 0 before the buffer, -1 at L_max
    return ramp_N.clamp(min=-1.0, max=0.0) * penalty
