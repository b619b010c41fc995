"""Importance correction between the sampling engine and the learner.

The engine samples with its own numerics (bf16 weights, other kernels) and, in the asynchronous loop, an older
policy, so its log-probs ``behavior_logprobs`` differ from the learner's ``old_logprobs`` for the same tokens.
The policy loss is reweighted by ``w = pi_old / mu`` (learner over engine), bounded to ``[w_min, cap]``
(truncated importance sampling, Yao et al., 2025, and its masked form). Four modes, named as TRL's
``vllm_importance_sampling_mode``:

* ``token_truncate`` (the default): ``w_t = exp(old_t - behavior_t)`` clamped to ``[w_min, cap]``.
* ``token_mask``: tokens whose ``w_t`` is outside ``[w_min, cap]`` get weight 0, the others keep ``w_t``.
* ``sequence_truncate``: one weight per answer, ``w_i = exp(sum_t (old_t - behavior_t))``, the product of its
  token weights (the exact importance weight of the whole answer, as TRL computes it; not GSPO's
  length-normalised mean), clamped to ``[w_min, cap]`` and applied to each of its tokens.
* ``sequence_mask``: answers whose ``w_i`` is outside ``[w_min, cap]`` get weight 0, the others keep ``w_i``.

A zero weight removes a token's policy term but not its place in the aggregation's denominator, nor its KL
term (as in TRL). ``w_min = None`` means no lower bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

EngineCorrection = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
ENGINE_CORRECTIONS: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class EngineWeights:
    """The engine importance weights of one batch.

    Attributes:
        weight_BT: the weight applied to each token's policy loss, ``[B, T]``, detached.
        raw: the weights before bounding, at the correction's level: ``[B, T]`` per token or ``[B, 1]`` per answer.
        outside_BT: bool ``[B, T]``, tokens whose weight (their own or their answer's) was outside
            ``[w_min, cap]``, that is truncated or masked.
        masked_BT: bool ``[B, T]``, tokens whose weight was set to 0 (mask modes only).
    """

    weight_BT: torch.Tensor
    raw: torch.Tensor
    outside_BT: torch.Tensor
    masked_BT: torch.Tensor


def engine_weights(
    old_logprobs_BT: torch.Tensor,
    behavior_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    mode: EngineCorrection = "token_truncate",
    cap: float = 2.0,
    min_weight: float | None = None,
) -> EngineWeights:
    """Bounded importance weights ``pi_old / mu`` of the engine's samples (see the module docstring).

    Args:
        old_logprobs_BT: the learner's log-probs at the start of the update, ``[B, T]``.
        behavior_logprobs_BT: the engine's log-probs of the same tokens, ``[B, T]``.
        mask_BT: response-token mask, ``[B, T]``.
        mode: ``token_truncate``, ``token_mask``, ``sequence_truncate`` or ``sequence_mask``.
        cap: upper bound of the weight.
        min_weight: lower bound, or ``None`` for none.

    Returns:
        :class:`EngineWeights`.
    """
    if mode not in ENGINE_CORRECTIONS:
        raise ValueError(f"unknown engine correction {mode!r}; choose one of {', '.join(ENGINE_CORRECTIONS)}")
    log_w = old_logprobs_BT.detach() - behavior_logprobs_BT.detach()  # [B, T]
    if mode.startswith("sequence"):
        log_w = (log_w * mask_BT.to(log_w.dtype)).sum(-1, keepdim=True)  # [B, 1]
    raw = torch.exp(log_w)  # [B, T] or [B, 1]
    outside = raw > cap
    if min_weight is not None:
        outside = outside | (raw < min_weight)
    if mode.endswith("truncate"):
        weight = raw.clamp(min=min_weight, max=cap)
        masked = torch.zeros_like(outside)
    else:
        weight = raw.masked_fill(outside, 0.0)
        masked = outside
    shape = mask_BT.shape
    return EngineWeights(weight_BT=weight.expand(shape), raw=raw, outside_BT=outside.expand(shape),
                         masked_BT=masked.expand(shape))


def weight_quantiles(raw: torch.Tensor, mask_BT: torch.Tensor,
                     qs: tuple[float, ...] = (0.05, 0.5, 0.95)) -> torch.Tensor:
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
