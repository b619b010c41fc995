"""Per-token policy-gradient terms: GRPO's clipped surrogate, GSPO, GSPO-token, CISPO, SAPO and GMPO.

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
  TRL 1.16's GSPO in ``benchmarks/versus_trl/trl_objectives.py``; TRL 1.16 no longer ships its ``sequence_token``
  level).
* ``cispo``: CISPO (MiniMax, 2025, "MiniMax-M1"): ``-sg[clip(r_t, ratio_min, ratio_max)] A log pi(y_t)``, a
  REINFORCE term weighted by a clipped, stop-gradient ratio, so every token keeps a gradient. The bounds are
  absolute weights, as TRL's ``cispo`` takes ``epsilon_high`` (recommended 5.0, ScaleRL's ``eps_max``); the
  paper writes them ``1 - eps_low^IS`` and ``1 + eps_high^IS`` and in practice sets no lower bound, which is
  the default here (``ratio_min=None``). Its loss value is ``-w A log pi`` (not ``-A`` at ratio 1, as the
  surrogates' is); only its gradient is comparable.
* ``sapo``: SAPO (Qwen team, 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347): the hard clip replaced
  by a soft, temperature-controlled gate, ``-f(r_t) A`` with ``f(r) = sigmoid(tau (r - 1)) * 4 / tau`` and
  ``tau = tau_pos`` where ``A > 0``, ``tau_neg`` elsewhere (TRL 1.16's per-token formula and defaults, 1.0 and 1.05:
  the gate of a negative advantage closes faster). Its gradient is ``-4 p (1 - p) r A grad log pi(y_t)`` with
  ``p = sigmoid(tau (r - 1))``: weight 1 at ``r = 1`` (GRPO's gradient), falling smoothly as the ratio leaves 1 on
  either side, whatever the advantage's sign, where the hard clip keeps the full gradient up to ``1 + eps`` and then
  none. Nothing is clipped, so ``clipped_BT`` is all False. The loss value at ``r = 1`` is ``-2 A / tau``, not
  ``-A``; only the gradients compare with the surrogates'.
* ``gmpo``: GMPO (Zhao et al., 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673): one ratio per answer,
  the geometric mean of its token ratios, each clipped first, in log space:
  ``s_i = exp(mean_t c_t)``, ``c_t = min(log r_t, clip(log r_t, -eps, eps))`` where ``A > 0`` and ``max(...)``
  elsewhere (PPO's pessimistic bound, written for log ratios), loss ``-A_i s_i``. The paper's range is
  ``(e^-0.4, e^0.4)``. A clipped token leaves the mean's gradient; the others get ``-A_i s_i / |y_i|`` each. Unlike
  GSPO, which clips the mean, GMPO clips each token and then averages, so one extreme token neither dominates the
  ratio nor silences the whole answer. Written on each token of the answer, as GSPO's, so ``seq_mean_token_mean``
  gives the paper's (and TRL's ``trl.experimental.gmpo``) mean over answers. A per-token advantage is averaged over
  the answer (as verl's ``geo_mean`` loss; the paper has one per answer) and its sign picks each token's clip side.

Settings: SAPO's temperatures are ``policy.sapo_temperature_pos`` and ``policy.sapo_temperature_neg``. GMPO's range
is ``policy.gmpo_clip_eps``, its own setting, although TRL's ``GMPOConfig`` and verl's ``geo_mean`` reuse their
surrogate clip settings read in log space (TRL with the default changed to 0.4): here ``clip_eps_low`` and
``clip_eps_high`` bound the ratio itself, ``[1 - eps, 1 + eps]``, with defaults 0.2 and 0.28, so reusing them would
change their meaning with the loss type and miss the paper's 0.4. One symmetric value, as the paper uses; TRL and
verl also take a separate upper bound.

Departures from TRL: the per-token values above are TRL's. The aggregation is a separate choice here, and
``policy.loss_type`` picks the paper's by default: ``seq_mean_token_mean`` for ``gspo`` and ``gspo_token``
(TRL's default ``loss_type="dapo"`` would weight each answer by its length, which TRL warns about), ``token_mean``
for ``cispo`` (MiniMax-M1's normalisation by the total token count; TRL's ``cispo`` always uses it),
``seq_mean_token_mean`` for ``sapo`` (the paper's and TRL's) and ``gmpo`` (a mean over answers, as the paper and TRL).
CISPO's bounds are settings of their own (``policy.cispo_ratio_max``, ``policy.cispo_ratio_min``) rather than the
surrogates' ``clip_eps_*``, whose good values (0.2 to 0.28) are an order of magnitude smaller. TRL's GMPO averages
its KL term per answer, which is what ``seq_mean_token_mean`` does with ours; it ignores the engine importance
weight, which here multiplies each token's copy of the answer's loss (so under ``seq_mean_token_mean`` an answer is
weighted by the mean of its tokens' engine weights; verl's ``geo_mean`` takes their geometric mean).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

PolicyObjective = Literal["grpo", "gspo", "gspo_token", "cispo", "sapo", "gmpo"]
POLICY_OBJECTIVES: tuple[str, ...] = ("grpo", "gspo", "gspo_token", "cispo", "sapo", "gmpo")


@dataclass
class PolicyTerm:
    """One objective's per-token loss and what the diagnostics need."""

    loss_BT: torch.Tensor  # [B, T] differentiable, padding not yet masked
    # [B, T] detached, before any clip; for gspo, gspo_token and gmpo the answer's ratio (GSPO's s_i, the geometric
    # mean of its unclipped token ratios) repeated over its tokens
    ratio_BT: torch.Tensor
    # [B, T] bool, where the clip acted: the clipped term taken (surrogates, gmpo: no gradient), the weight cut
    # (cispo: the token keeps a gradient); never for sapo, whose gate is soft
    clipped_BT: torch.Tensor


def sequence_log_ratio(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised log-ratio ``mean_t log r_t`` ``[B, 1]`` over each answer's tokens of ``mask_BT``
    (0 for an answer without tokens), from ``log_ratio_BT = log pi - log pi_old`` ``[B, T]``."""
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
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    gmpo_clip_eps: float = 0.4,
) -> PolicyTerm:
    """The per-token loss of one policy ``objective`` (the module docstring; the scalars as in
    :class:`~grpo_rl.algo.loss.LossSettings`).

    Args:
        logprobs_BT, old_logprobs_BT: log-probs under the policy being trained and at the start of the update
            (detached here), ``[B, T]``.
        adv_BT: advantages, ``[B, 1]`` (one per answer) or ``[B, T]``.
        mask_BT: response-token mask ``[B, T]``, for the sequence ratios of ``gspo``, ``gspo_token`` and ``gmpo``.
    """
    log_ratio = logprobs_BT - old_logprobs_BT.detach()  # [B, T]
    if objective == "cispo":
        ratio = torch.exp(log_ratio)  # [B, T]
        # [B, T], detached: the gradient flows through log pi alone
        weight = torch.clamp(ratio, min=cispo_ratio_min, max=cispo_ratio_max).detach()
        loss_BT = -weight * adv_BT * logprobs_BT
        clipped = ratio > cispo_ratio_max
        if cispo_ratio_min is not None:
            clipped = clipped | (ratio < cispo_ratio_min)
        return PolicyTerm(loss_BT=loss_BT, ratio_BT=ratio.detach(), clipped_BT=clipped)
    if objective == "sapo":
        ratio = torch.exp(log_ratio)  # [B, T]
        tau = torch.where(
            adv_BT > 0, adv_BT.new_tensor(sapo_temperature_pos), adv_BT.new_tensor(sapo_temperature_neg)
        )  # [B, 1] or [B, T]
        gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau  # [B, T]: f(r), f'(1) = 1
        return PolicyTerm(
            loss_BT=-gate * adv_BT,
            ratio_BT=ratio.detach(),
            clipped_BT=torch.zeros(mask_BT.shape, dtype=torch.bool, device=mask_BT.device),
        )
    if objective == "gmpo":
        return _gmpo_term(log_ratio, adv_BT, mask_BT, gmpo_clip_eps)
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
    return PolicyTerm(
        loss_BT=loss_BT, ratio_BT=ratio.detach().expand(mask_BT.shape), clipped_BT=clipped.expand(mask_BT.shape)
    )


def _gmpo_term(log_ratio_BT: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float) -> PolicyTerm:
    """GMPO's answer loss ``-A_i exp(mean_t c_t)`` on each of its tokens (see the module docstring)."""
    clamped = log_ratio_BT.clamp(-eps, eps)  # [B, T]
    positive = adv_BT > 0  # [B, 1] or [B, T]
    # PPO's min(r A, clip(r) A), taken on log r: the lower of the two where A > 0, the higher where A <= 0.
    clipped_log = torch.where(positive, torch.minimum(log_ratio_BT, clamped), torch.maximum(log_ratio_BT, clamped))
    log_s = sequence_log_ratio(clipped_log, mask_BT)  # [B, 1]
    if adv_BT.shape[-1] == 1:
        adv_i = adv_BT  # [B, 1]
    else:  # one advantage per answer: the mean of its tokens' (verl's geo_mean)
        m = mask_BT.to(adv_BT.dtype)
        adv_i = (adv_BT * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1]
    loss_BT = (-adv_i * torch.exp(log_s)).expand(mask_BT.shape)  # [B, T]
    with torch.no_grad():
        ratio = torch.exp(sequence_log_ratio(log_ratio_BT, mask_BT)).expand(mask_BT.shape)  # [B, T], unclipped
        clipped = ((log_ratio_BT > eps) & (adv_BT > 0)) | ((log_ratio_BT < -eps) & (adv_BT < 0))
    return PolicyTerm(loss_BT=loss_BT, ratio_BT=ratio, clipped_BT=clipped.expand(mask_BT.shape))
