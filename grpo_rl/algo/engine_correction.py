"""Importance correction between the sampling engine and the learner.

The engine samples with its own numerics (bf16 weights, other kernels) and, in the asynchronous loop, an older
policy, so its log-probs ``behavior_logprobs`` differ from the learner's ``old_logprobs`` for the same tokens.
The policy loss is reweighted by ``w = pi_old / mu`` (learner over engine), bounded to ``[w_min, cap]``
(truncated importance sampling, Yao et al., 2025, and its masked form). Four modes, named as TRL's
``vllm_importance_sampling_mode``, and two band modes after IcePop:

* ``token_truncate`` (the default): ``w_t = exp(old_t - behavior_t)`` clamped to ``[w_min, cap]``.
* ``token_mask``: tokens whose ``w_t`` is outside ``[w_min, cap]`` get weight 0, the others keep ``w_t``.
* ``sequence_truncate``: one weight per answer, ``w_i = exp(sum_t (old_t - behavior_t))``, the product of its
  token weights (the exact importance weight of the whole answer, as TRL computes it; not GSPO's
  length-normalised mean), clamped to ``[w_min, cap]`` and applied to each of its tokens.
* ``sequence_mask``: answers whose ``w_i`` is outside ``[w_min, cap]`` get weight 0, the others keep ``w_i``.
* ``token_band_mask``: IcePop (inclusionAI, 2025, "Small Leak Can Sink a Great Ship: Boost RL Training on MoE with
  IcePop", and the Ring-1T report, "Every Step Evolves", arXiv:2510.18855): the policy term of token ``t`` is
  multiplied by ``M(w_t)``, ``M(k) = k`` for ``k in [alpha, beta]`` and 0 otherwise, with ``alpha``, ``beta`` the
  band ``[w_min, w_max]`` (Ring-1T: 0.5 and 5). Inside the band the token keeps its ratio as weight, as the paper's
  ``M`` and NeMo-RL's ``icepop`` mode do (SkyRL's token mask and verl's rejection sampling instead give weight 1 and
  leave weighting to a separate TIS step).
* ``sequence_band_mask``: the same at the answer's level, ``M(rho_i)`` on each of its tokens, with
  ``rho_i = exp(mean_t log w_t)`` the geometric mean of its token weights (the length-normalised ratio of GSPO, and
  of the geometric sequence masks of SkyRL, verl's ``seq_mean_k1`` rejection and NeMo-RL's ``seq-mask-tis``, whose
  kept answers keep their raw token weights instead).

The band modes differ from the mask modes in their bounds and, at the answer level, in the weight. ``token_band_mask``
computes the same weights as ``token_mask`` given the same two bounds; what it adds is IcePop's two-sided band:
both bounds required, the upper one ``w_max`` rather than ``cap`` (TIS's cap, default 2; IcePop's upper bound is
5), while ``token_mask`` bounds from above only unless ``w_min`` is set. ``sequence_band_mask`` tests and applies
the geometric mean, on the per-token scale, where ``sequence_mask`` uses the product over the answer, which for long
answers leaves any band of per-token width.

A zero weight removes a token's policy term but not its place in the aggregation's denominator, nor its KL
term (as in TRL). ``w_min = None`` means no lower bound (the band modes need one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

EngineCorrection = Literal[
    "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "token_band_mask", "sequence_band_mask"
]
ENGINE_CORRECTIONS: tuple[str, ...] = (
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "token_band_mask",
    "sequence_band_mask",
)
BAND_CORRECTIONS: tuple[str, ...] = ("token_band_mask", "sequence_band_mask")


@dataclass
class EngineWeights:
    """The engine importance weights of one batch."""

    weight_BT: torch.Tensor  # [B, T] detached, the weight of each token's policy loss
    # before bounding, at the correction's level: [B, T] per token, or [B, 1] per answer (the product of its token
    # weights; for sequence_band_mask their geometric mean)
    raw: torch.Tensor
    outside_BT: torch.Tensor  # [B, T] bool, the weight (own or answer's) was outside its bounds: truncated or masked
    masked_BT: torch.Tensor  # [B, T] bool, the weight was set to 0 (mask and band modes only)


def engine_weights(
    old_logprobs_BT: torch.Tensor,
    behavior_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    mode: EngineCorrection = "token_truncate",
    cap: float = 2.0,
    min_weight: float | None = None,
    max_weight: float | None = None,
) -> EngineWeights:
    """Bounded importance weights ``pi_old / mu`` of the engine's samples, from the learner's
    ``old_logprobs_BT`` and the engine's ``behavior_logprobs_BT`` ``[B, T]`` (modes and bounds: the module
    docstring; ``cap`` bounds all but the band modes, ``max_weight`` only them)."""
    if mode not in ENGINE_CORRECTIONS:
        raise ValueError(f"unknown engine correction {mode!r}; choose one of {', '.join(ENGINE_CORRECTIONS)}")
    if mode in BAND_CORRECTIONS:
        if min_weight is None or max_weight is None:
            raise ValueError(f"engine correction {mode!r} needs both bounds of its band, min_weight and max_weight")
        high = max_weight
    else:
        high = cap
    log_w = old_logprobs_BT.detach() - behavior_logprobs_BT.detach()  # [B, T]
    if mode.startswith("sequence"):
        m = mask_BT.to(log_w.dtype)
        log_w = (log_w * m).sum(-1, keepdim=True)  # [B, 1]: log of the product of the answer's token weights
        if mode == "sequence_band_mask":
            log_w = log_w / m.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1]: log of their geometric mean
    raw = torch.exp(log_w)  # [B, T] or [B, 1]
    outside = raw > high
    if min_weight is not None:
        outside = outside | (raw < min_weight)
    if mode.endswith("truncate"):
        weight = raw.clamp(min=min_weight, max=high)
        masked = torch.zeros_like(outside)
    else:
        weight = raw.masked_fill(outside, 0.0)
        masked = outside
    shape = mask_BT.shape
    return EngineWeights(
        weight_BT=weight.expand(shape), raw=raw, outside_BT=outside.expand(shape), masked_BT=masked.expand(shape)
    )


def weight_quantiles(
    raw: torch.Tensor, mask_BT: torch.Tensor, qs: tuple[float, ...] = (0.05, 0.5, 0.95)
) -> torch.Tensor:
    """Quantiles of the unbounded weights over the answers' tokens (``raw`` ``[B, T]``) or over the answers that
    have tokens (``raw`` ``[B, 1]``), ``[len(qs)]``; all ones for an empty batch (no correction to report)."""
    if raw.shape[-1] == 1 and mask_BT.shape[-1] != 1:
        values = raw[:, 0][mask_BT.sum(-1) > 0]  # [B']
    else:
        values = raw[mask_BT.bool()]  # [N]
    q = torch.tensor(qs, dtype=torch.float32, device=raw.device)
    if values.numel() == 0:
        return torch.ones_like(q)
    # A long answer's product of weights can overflow to inf; interpolating between two infs would give nan.
    values = values.float().clamp(max=torch.finfo(torch.float32).max)
    return torch.quantile(values, q)
