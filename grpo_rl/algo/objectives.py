"""Per-token policy-gradient terms: GRPO's clipped surrogate, GSPO, GSPO-token and CISPO.

Each objective turns the log-probs of the policy being trained (``logprobs``) and of the policy at the start of
the update (``old_logprobs``) into a per-token loss ``[B, T]``; :func:`grpo_rl.algo.loss.grpo_loss` then applies the
engine importance weight and aggregates. With ``r_t = pi(y_t) / pi_old(y_t)``:

* ``grpo``: the PPO/GRPO clipped surrogate ``-min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)``
  (Shao et al., 2024; DAPO's separate ``eps_high``, Yu et al., 2025).
* ``gspo``: GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization"). One ratio per answer,
  length-normalised, ``s_i = exp(mean_t log r_t)``, clipped at the sequence level:
  ``-min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``. The sequence's loss is written on each of its
  tokens, so ``seq_mean_token_mean`` aggregation gives the paper's mean over answers, as TRL's
  ``importance_sampling_level="sequence"`` with ``loss_type="grpo"`` does. The paper clips with
  ``eps_low = 3e-4``, ``eps_high = 4e-4``: a length-normalised ratio moves far less than a token's.
* ``gspo_token``: the paper's GSPO-token, ``s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]``: the value
  (and so the clip decision) is ``s_i`` for every token, the gradient flows per token, ``s_i grad log pi(y_t)``,
  and the advantage may differ per token. With one advantage per answer its gradient equals GSPO's (checked against
  TRL 1.16's GSPO in ``benchmarks/trl_objectives.py``; TRL 1.16 no longer ships its ``sequence_token`` level).
* ``cispo``: CISPO (MiniMax, 2025, "MiniMax-M1"): ``-sg[clip(r_t, ratio_min, ratio_max)] A log pi(y_t)``, a
  REINFORCE term weighted by a clipped, stop-gradient ratio, so every token keeps a gradient. The bounds are
  absolute weights, as TRL's ``cispo`` takes ``epsilon_high`` (recommended 5.0, ScaleRL's ``eps_max``); the
  paper writes them ``1 - eps_low^IS`` and ``1 + eps_high^IS`` and in practice sets no lower bound, which is
  the default here (``ratio_min=None``). Its loss value is ``-w A log pi`` (not ``-A`` at ratio 1, as the
  surrogates' is); only its gradient is comparable.

Departures from TRL: the per-token values above are TRL's. The aggregation is a separate choice here, and
``policy.loss_type`` picks the paper's by default: ``seq_mean_token_mean`` for ``gspo`` and ``gspo_token``
(TRL's default ``loss_type="dapo"`` would weight each answer by its length, which TRL warns about), ``token_mean``
for ``cispo`` (MiniMax-M1's normalisation by the total token count; TRL's ``cispo`` always uses it). CISPO's
bounds are settings of their own (``policy.cispo_ratio_max``, ``policy.cispo_ratio_min``) rather than the
surrogates' ``clip_eps_*``, whose good values (0.2 to 0.28) are an order of magnitude smaller.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

PolicyObjective = Literal["grpo", "gspo", "gspo_token", "cispo"]
POLICY_OBJECTIVES: tuple[str, ...] = ("grpo", "gspo", "gspo_token", "cispo")


@dataclass
class PolicyTerm:
    """One objective's per-token loss and what the diagnostics need.

    Attributes:
        loss_BT: per-token policy loss ``[B, T]`` (padding not yet masked), differentiable.
        ratio_BT: the importance ratio the objective uses, detached, ``[B, T]`` (a sequence ratio repeated over
            the answer's tokens for ``gspo`` and ``gspo_token``).
        clipped_BT: bool ``[B, T]``, tokens on which the clip acted: for the surrogates, where the clipped term
            was the one taken (no gradient); for ``cispo``, where the weight was cut (the token keeps a gradient).
    """

    loss_BT: torch.Tensor
    ratio_BT: torch.Tensor
    clipped_BT: torch.Tensor


def sequence_log_ratio(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised log-ratio ``mean_t log r_t`` over each answer's tokens, ``[B, 1]``.

    Args:
        log_ratio_BT: ``log pi - log pi_old`` per token, ``[B, T]``.
        mask_BT: response-token mask, ``[B, T]``; an answer without tokens gets 0.
    """
    mask_BT = mask_BT.to(log_ratio_BT.dtype)
    return (log_ratio_BT * mask_BT).sum(-1, keepdim=True) / mask_BT.sum(-1, keepdim=True).clamp(min=1.0)


def policy_term(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    objective: PolicyObjective = "grpo",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    cispo_ratio_max: float = 5.0,
    cispo_ratio_min: float | None = None,
) -> PolicyTerm:
    """The per-token loss of one policy objective (see the module docstring).

    Args:
        logprobs_BT: log-probs under the policy being trained, ``[B, T]``.
        old_logprobs_BT: log-probs at the start of the update, ``[B, T]`` (detached here).
        adv_BT: advantages, ``[B, 1]`` (one per answer) or ``[B, T]``.
        mask_BT: response-token mask, ``[B, T]``; used by the sequence ratio of ``gspo`` and ``gspo_token``.
        objective: ``grpo``, ``gspo``, ``gspo_token`` or ``cispo``.
        clip_eps_low, clip_eps_high: the surrogates clip their ratio to ``[1 - clip_eps_low, 1 + clip_eps_high]``.
        cispo_ratio_max, cispo_ratio_min: bounds of CISPO's weight (``None``: no lower bound).

    Returns:
        :class:`PolicyTerm`.
    """
    log_ratio = logprobs_BT - old_logprobs_BT.detach()  # [B, T]
    if objective == "cispo":
        ratio = torch.exp(log_ratio)  # [B, T]
        weight = torch.clamp(ratio, min=cispo_ratio_min, max=cispo_ratio_max).detach()  # [B, T]
        loss_BT = -weight * adv_BT * logprobs_BT
        clipped = ratio > cispo_ratio_max
        if cispo_ratio_min is not None:
            clipped = clipped | (ratio < cispo_ratio_min)
        return PolicyTerm(loss_BT=loss_BT, ratio_BT=ratio.detach(), clipped_BT=clipped)
    if objective == "grpo":
        log_w = log_ratio  # [B, T]
    elif objective == "gspo":
        log_w = sequence_log_ratio(log_ratio, mask_BT)  # [B, 1]
    elif objective == "gspo_token":
        log_s = sequence_log_ratio(log_ratio, mask_BT).detach()  # [B, 1]
        log_w = logprobs_BT - logprobs_BT.detach() + log_s  # [B, T]: value log s_i, gradient that of log pi(y_t)
    else:
        raise ValueError(f"unknown policy objective {objective!r}; choose one of {', '.join(POLICY_OBJECTIVES)}")
    ratio = torch.exp(log_w)  # [B, T] or [B, 1]
    pg_loss1 = -adv_BT * ratio
    pg_loss2 = -adv_BT * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss_BT = torch.maximum(pg_loss1, pg_loss2).expand(mask_BT.shape)  # [B, T]
    with torch.no_grad():
        clipped = ((ratio < 1.0 - clip_eps_low) & (adv_BT < 0)) | ((ratio > 1.0 + clip_eps_high) & (adv_BT > 0))
    return PolicyTerm(loss_BT=loss_BT, ratio_BT=ratio.detach().expand(mask_BT.shape),
                      clipped_BT=clipped.expand(mask_BT.shape))
