"""The GRPO objective: a KL-penalised clipped surrogate over response tokens.

Implements the policy loss of GRPO (Shao et al., 2024, "DeepSeekMath", eq. 3) with the refinements that
later work found to matter, each selectable by an explicit argument:

* Separate low/high clip ranges ("clip-higher", DAPO, Yu et al., 2025): the ratio is clipped to
  ``[1 - eps_low, 1 + eps_high]``.
* Aggregation over tokens:
    - ``"seq_mean_token_mean"``: mean over sequences of per-sequence token means (original GRPO);
    - ``"token_mean"``: mean over all response tokens of the batch (DAPO);
    - ``"seq_mean_token_sum_norm"``: token sum divided by a constant ``max_tokens`` and averaged over
      sequences (Dr. GRPO, Liu et al., 2025), which removes the length bias of per-sequence means.
* KL to the reference policy with the k1, k2 or k3 estimator (Schulman, 2020, "Approximating KL
  divergence"). GRPO uses k3 in the loss. When the KL is applied in the reward instead
  (:func:`kl_penalised_rewards`), ``kl_coef`` here is 0.
* A truncated importance weight between the policy the learner evaluates at (``old_logprobs``) and the
  engine that sampled (``behavior_logprobs``), capped at ``tis_cap`` (Yao et al., 2025, "truncated
  importance sampling"); it corrects engine/learner numeric mismatch and, in the asynchronous loop, policy lag.

Departure from the paper: the KL term is aggregated with the same rule as the policy term, so both see the
same token weighting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclass
class GRPOLossOutput:
    """Named loss terms (differentiable) and detached diagnostics.

    ``loss`` is ``loss_policy + loss_kl``; every other field is a detached scalar.
    """

    loss: torch.Tensor
    loss_policy: torch.Tensor
    loss_kl: torch.Tensor
    clip_fraction: torch.Tensor  # fraction of tokens whose ratio was clipped
    kl_approx: torch.Tensor  # k3 estimate of KL(old || new), for monitoring the step size
    kl_ref: torch.Tensor  # mean chosen-estimator KL to the reference, per token
    ratio_mean: torch.Tensor
    ess: torch.Tensor  # normalised effective sample size of the importance weights, in (0, 1]
    tis_fraction: torch.Tensor  # fraction of tokens whose behaviour weight hit the cap
    entropy: torch.Tensor | None = None

    def diagnostics(self) -> dict[str, float]:
        """All scalar fields as floats, for logging."""
        out = {k: float(v.detach()) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return out


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi.

    Args:
        logprobs: log pi(a_t), ``[B, T]``.
        ref_logprobs: log pi_ref(a_t), ``[B, T]``.
        estimator: ``k1`` = log r, ``k2`` = (log r)^2 / 2, ``k3`` = exp(-log r) - 1 + log r, with
            ``log r = logprobs - ref_logprobs``.

    Returns:
        ``[B, T]`` per-token estimates.
    """
    log_ratio = logprobs - ref_logprobs  # [B, T]
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        # Clamp before exp: a token the reference finds very unlikely would otherwise overflow.
        neg = (-log_ratio).clamp(max=20.0)
        return torch.exp(neg) - 1.0 - neg
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of 'k1', 'k2', 'k3'")


def aggregate(values_BT: torch.Tensor, mask_BT: torch.Tensor, mode: Aggregation, max_tokens: int | None) -> torch.Tensor:
    """Reduce per-token values to a scalar with one of the standard GRPO aggregations.

    Args:
        values_BT: per-token values, ``[B, T]``.
        mask_BT: 1 for response tokens, 0 for padding, ``[B, T]``.
        mode: see the module docstring.
        max_tokens: the constant normaliser for ``seq_mean_token_sum_norm`` (usually the maximum
            response length); ignored otherwise.
    """
    mask_BT = mask_BT.to(values_BT.dtype)
    masked = values_BT * mask_BT
    if mode == "token_mean":
        return masked.sum() / mask_BT.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(-1) / mask_BT.sum(-1).clamp(min=1.0)  # [B]
        return per_seq.mean()
    if mode == "seq_mean_token_sum_norm":
        if not max_tokens or max_tokens <= 0:
            raise ValueError("aggregation 'seq_mean_token_sum_norm' needs a positive max_tokens")
        return (masked.sum(-1) / float(max_tokens)).mean()
    raise ValueError(
        f"unknown aggregation {mode!r}; choose 'token_mean', 'seq_mean_token_mean' or 'seq_mean_token_sum_norm'"
    )


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    behavior_logprobs: torch.Tensor | None = None,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    aggregation: Aggregation = "token_mean",
    max_tokens: int | None = None,
    tis_cap: float | None = 2.0,
    entropy: torch.Tensor | None = None,
    scale: float = 1.0,
) -> GRPOLossOutput:
    """Clipped-surrogate GRPO loss with an optional KL penalty to the reference.

    Args:
        logprobs: log-probs of the sampled tokens under the policy being trained, ``[B, T]``.
        old_logprobs: the same under the policy at the start of this update (detached), ``[B, T]``.
            When each batch is used for a single optimizer step, pass ``logprobs.detach()``.
        advantages: one advantage per sequence ``[B]`` or per token ``[B, T]``.
        mask: response-token mask, ``[B, T]``.
        ref_logprobs: reference-policy log-probs, ``[B, T]``; required when ``kl_coef > 0``.
        behavior_logprobs: log-probs recorded by the sampling engine, ``[B, T]``; enables the truncated
            importance weight ``min(exp(old - behavior), tis_cap)``.
        clip_eps_low, clip_eps_high: the ratio is clipped to ``[1 - clip_eps_low, 1 + clip_eps_high]``.
        kl_coef: weight of the KL term (0 disables it).
        kl_estimator: ``k1``, ``k2`` or ``k3``.
        aggregation: token aggregation, see the module docstring.
        max_tokens: normaliser for ``seq_mean_token_sum_norm``.
        tis_cap: cap of the behaviour importance weight; ``None`` disables the correction.
        entropy: optional per-token entropy ``[B, T]``, reported as a diagnostic only.
        scale: multiplies the loss terms, e.g. a micro-batch's share of the gradient-accumulation step.

    Returns:
        :class:`GRPOLossOutput`.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    mask_f = mask.to(logprobs.dtype)  # [B, T]
    adv_BT = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    adv_BT = adv_BT.to(logprobs.dtype)

    log_ratio = logprobs - old_logprobs.detach()  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    pg_loss1 = -adv_BT * ratio
    pg_loss2 = -adv_BT * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    pg_loss_BT = torch.maximum(pg_loss1, pg_loss2)  # [B, T]

    if behavior_logprobs is not None and tis_cap is not None:
        tis_weight = torch.exp(old_logprobs.detach() - behavior_logprobs.detach())  # [B, T]
        tis_clipped = tis_weight > tis_cap
        pg_loss_BT = pg_loss_BT * tis_weight.clamp(max=tis_cap)
    else:
        tis_weight = torch.ones_like(ratio)
        tis_clipped = torch.zeros_like(ratio, dtype=torch.bool)

    loss_policy = aggregate(pg_loss_BT, mask_f, aggregation, max_tokens) * scale

    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (enable the reference model or set kl_coef=0)")
        kl_BT = kl_estimate(logprobs, ref_logprobs.detach(), kl_estimator)  # [B, T]
        loss_kl = kl_coef * aggregate(kl_BT, mask_f, aggregation, max_tokens) * scale
        kl_ref = (kl_BT.detach() * mask_f).sum() / mask_f.sum().clamp(min=1.0)
    else:
        loss_kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        if ref_logprobs is not None:
            kl_BT = kl_estimate(logprobs.detach(), ref_logprobs, kl_estimator)
            kl_ref = (kl_BT * mask_f).sum() / mask_f.sum().clamp(min=1.0)
        else:
            kl_ref = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    with torch.no_grad():
        n_tok = mask_f.sum().clamp(min=1.0)
        clipped = ((ratio < 1.0 - clip_eps_low) & (adv_BT < 0)) | ((ratio > 1.0 + clip_eps_high) & (adv_BT > 0))
        clip_fraction = (clipped.to(mask_f.dtype) * mask_f).sum() / n_tok
        kl_approx = (((ratio - 1.0) - log_ratio) * mask_f).sum() / n_tok
        ratio_mean = (ratio * mask_f).sum() / n_tok
        w = (ratio * tis_weight.clamp(max=tis_cap) if tis_cap is not None else ratio) * mask_f
        ess = w.sum().pow(2) / (w.pow(2).sum().clamp(min=1e-12) * n_tok)
        tis_fraction = (tis_clipped.to(mask_f.dtype) * mask_f).sum() / n_tok
        ent = (entropy * mask_f).sum() / n_tok if entropy is not None else None

    return GRPOLossOutput(
        loss=loss_policy + loss_kl,
        loss_policy=loss_policy,
        loss_kl=loss_kl,
        clip_fraction=clip_fraction,
        kl_approx=kl_approx,
        kl_ref=kl_ref,
        ratio_mean=ratio_mean,
        ess=ess,
        tis_fraction=tis_fraction,
        entropy=ent,
    )


def kl_penalised_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_coef: float,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """Subtract ``kl_coef`` times the sequence's summed KL estimate from its reward ("KL in reward").

    Args:
        rewards: ``[B]`` task rewards.
        logprobs: sampling-policy log-probs ``[B, T]``.
        ref_logprobs: reference log-probs ``[B, T]``.
        mask: response mask ``[B, T]``.

    Returns:
        ``[B]`` penalised rewards.
    """
    kl_B = (kl_estimate(logprobs, ref_logprobs, estimator) * mask.to(logprobs.dtype)).sum(-1)  # [B]
    return rewards - kl_coef * kl_B
