"""Model forward -> per-token log-probs of the sampled answer tokens.

The prompt is left-padded and the answer right-padded (see :mod:`grpo_rl.rollout.base`), so in the
concatenated sequence ``[prompt | answer]`` the logits that predict answer token ``t`` sit at position
``Lp - 1 + t``. Only those ``Lr`` positions go through the LM head: the vocabulary projection and the
log-softmax are the largest per-token cost of a small model, and prompt positions would be thrown away.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict


@dataclass
class TokenLogprobs:
    """``logprobs``: ``[B, Lr]`` log-prob of each answer token; ``entropy``: ``[B, Lr]`` or None."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None


def _backbone_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The decoder stack and the LM head of an HF causal LM (unwrapping PEFT models)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def sequence_logprobs(
    model: torch.nn.Module,
    batch: TensorDict,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> TokenLogprobs:
    """Log-probs of ``batch["response_ids"]`` under ``model``.

    Args:
        model: an HF causal LM.
        batch: holds ``prompt_ids``/``prompt_mask`` ``[B, Lp]`` and ``response_ids``/``response_mask`` ``[B, Lr]``.
        temperature: the sampling temperature; logits are divided by it, as the engine did.
        with_entropy: also return the per-token entropy of the (tempered) distribution.

    Returns:
        :class:`TokenLogprobs` with zeros at padded answer positions.
    """
    prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]  # [B, Lp]
    response_ids, response_mask = batch["response_ids"], batch["response_mask"]  # [B, Lr]
    lp, lr = prompt_ids.shape[1], response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)  # [B, Lp + Lr]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)  # [B, Lp + Lr]
    # Positions count real tokens only, so a left-padded prompt sees the same positions as an unpadded one.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, Lp + Lr]

    backbone, head = _backbone_and_head(model)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    hidden = hidden[:, lp - 1 : lp - 1 + lr]  # [B, Lr, H]: the states that predict answer tokens
    logits = head(hidden).float()  # [B, Lr, V]
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)  # [B, Lr]
    token_logits = logits.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)  # [B, Lr]
    mask = response_mask.to(logits.dtype)
    logprobs = (token_logits - logz) * mask  # [B, Lr]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = (logz - (probs * logits).sum(-1)) * mask  # [B, Lr]
    return TokenLogprobs(logprobs=logprobs, entropy=entropy)
