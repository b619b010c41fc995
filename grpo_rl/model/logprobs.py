"""Model forward -> per-token log-probs of the sampled answer tokens.

The prompt is left-padded and the answer right-padded (see :mod:`grpo_rl.engines.base`), so in the
concatenated sequence ``[prompt | answer]`` the logits that predict answer token ``t`` sit at position
``Lp - 1 + t``. Only those ``Lr`` positions go through the LM head: the vocabulary projection and the
log-softmax are the largest per-token cost of a small model, and prompt positions would be thrown away.

With ``share_prompt=True`` the answers of a group are packed behind one copy of their prompt
(:mod:`grpo_rl.model.packing`), so the prompt goes through the model once per group instead of once per answer; only
real answer tokens reach the LM head. The log-probs are the same up to summation order.

With ``top_p < 1`` or ``top_k > 0`` the log-probs are those of the truncated distribution the engine sampled from
(:mod:`grpo_rl.model.vocab`), and ``outside`` flags the answer tokens that lie outside the learner's own truncated set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from grpo_rl.model import prefix_attention
from grpo_rl.model.packing import pack_groups
from grpo_rl.model.vocab import token_logprobs


@dataclass
class TokenLogprobs:
    """``logprobs``: ``[B, Lr]`` log-prob of each answer token; ``entropy``: ``[B, Lr]`` or None; ``outside``: bool
    ``[B, Lr]``, answer tokens outside the truncated sampling set (False at padding), None without truncation."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    outside: torch.Tensor | None = None


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
    entropy_grad: bool = False,
    share_prompt: bool = False,
    attention: str = "auto",
    top_p: float = 1.0,
    top_k: int = 0,
) -> TokenLogprobs:
    """Log-probs of ``batch["response_ids"]`` under the HF causal LM ``model``, at the engine's ``temperature``,
    ``top_p`` and ``top_k`` (:mod:`grpo_rl.model.vocab`), zeros at padded answer positions.

    Args:
        batch: holds ``prompt_ids``/``prompt_mask`` ``[B, Lp]`` and ``response_ids``/``response_mask`` ``[B, Lr]``.
        entropy_grad: give the entropy a gradient (an entropy bonus in the loss); otherwise it is detached.
        share_prompt: run each group's prompt once (:func:`packed_sequence_logprobs`).
        attention: how a packed row is attended (:func:`packed_attention`).
    """
    if share_prompt:
        return packed_sequence_logprobs(
            model,
            batch,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            attention=attention,
            top_p=top_p,
            top_k=top_k,
        )
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
    b = response_ids.shape[0]
    flat_lp, flat_ent, flat_out = token_logprobs(
        hidden.reshape(b * lr, -1),
        head,
        response_ids.reshape(-1),
        temperature=temperature,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
        top_p=top_p,
        top_k=top_k,
    )
    mask = response_mask.to(flat_lp.dtype)
    logprobs = flat_lp.view(b, lr) * mask  # [B, Lr]
    entropy = flat_ent.view(b, lr) * mask if flat_ent is not None else None
    outside = flat_out.view(b, lr) & response_mask.bool() if flat_out is not None else None
    return TokenLogprobs(logprobs=logprobs, entropy=entropy, outside=outside)


def _packed_mask(model: torch.nn.Module, mask_bool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The packed attention mask in the form the model's attention implementation takes as given."""
    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl == "sdpa":
        return mask_bool  # torch's SDPA: True = attend
    if impl == "eager":
        return torch.zeros(mask_bool.shape, dtype=dtype, device=mask_bool.device).masked_fill(
            ~mask_bool, torch.finfo(dtype).min
        )  # added to the scores
    raise ValueError(
        f"share_prompt needs the 'sdpa' or 'eager' attention implementation, not {impl!r}; "
        "set train.share_prompt=false or load the model with attn_implementation='sdpa'"
    )


ATTENTION = ("auto", "prefix", "dense")


def packed_attention(model: torch.nn.Module, setting: str, device: torch.device) -> str:
    """``prefix`` or ``dense``: how ``model`` attends a packed row on ``device`` for ``train.packed_attention``.

    ``prefix`` is the shared-prefix kernel (:mod:`grpo_rl.model.prefix_attention`), ``dense`` the packed mask through
    the model's own attention. ``auto`` takes ``prefix`` where it runs (torch's CPU flash kernel, an ``sdpa`` model
    whose layers are neither compiled, which would trace them again for every layout, nor checkpointed, whose
    recomputation runs outside the forward) and ``dense`` elsewhere.
    """
    if setting not in ATTENTION:
        raise ValueError(f"train.packed_attention={setting!r}: choose one of {', '.join(ATTENTION)}")
    backbone, _ = _backbone_and_head(model)
    compiled = any(getattr(m, "_compiled_call_impl", None) is not None for m in backbone.modules())
    # Gradient checkpointing recomputes a layer during the backward, outside the forward's switch of the attention.
    recomputed = any(getattr(m, "gradient_checkpointing", False) is True for m in backbone.modules())
    runs = (
        prefix_attention.supported(device)
        and getattr(model.config, "_attn_implementation", "sdpa") == "sdpa"
        and not compiled
        and not recomputed
    )
    if setting == "prefix" and not runs:
        raise ValueError(
            "train.packed_attention=prefix needs a CPU, an 'sdpa' model and layers neither compiled nor "
            f"checkpointed; here: {device.type}, {getattr(model.config, '_attn_implementation', None)!r}, "
            f"compiled={compiled}, gradient checkpointing={recomputed}. Set train.packed_attention=auto"
        )
    return "prefix" if setting == "prefix" or (setting == "auto" and runs) else "dense"


def packed_sequence_logprobs(
    model: torch.nn.Module,
    batch: TensorDict,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    attention: str = "auto",
    top_p: float = 1.0,
    top_k: int = 0,
) -> TokenLogprobs:
    """:func:`sequence_logprobs` with each group's prompt run once (:mod:`grpo_rl.model.packing`); rows with the
    same prompt must be consecutive, as every engine returns them."""
    response_ids = batch["response_ids"]  # [B, Lr]
    backbone, head = _backbone_and_head(model)
    if packed_attention(model, attention, response_ids.device) == "prefix":
        packed = pack_groups(batch, dense_mask=False)
        layout = prefix_attention.PrefixLayout.build(
            packed.prompt_len, packed.answer_lens, packed.input_ids.shape[1], packed.input_ids.device
        )
        with prefix_attention.prefix_attention_for(model):
            hidden = backbone(
                input_ids=packed.input_ids, position_ids=packed.position_ids, prefix_layout=layout
            ).last_hidden_state  # [R, S, H]
    else:
        packed = pack_groups(batch)
        assert packed.attention_mask is not None
        dtype = next(model.parameters()).dtype
        hidden = backbone(
            input_ids=packed.input_ids,
            attention_mask=_packed_mask(model, packed.attention_mask, dtype),
            position_ids=packed.position_ids,
        ).last_hidden_state  # [R, S, H]
    hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, packed.source_index)  # [T, H]
    token_lp, token_ent, token_out = token_logprobs(
        hidden,
        head,
        packed.target_ids,
        temperature=temperature,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
        top_p=top_p,
        top_k=top_k,
    )  # [T]
    where = (packed.target_row, packed.target_col)
    zeros = torch.zeros(response_ids.shape, dtype=token_lp.dtype, device=token_lp.device)  # [B, Lr]
    logprobs = zeros.index_put(where, token_lp)  # [B, Lr]
    entropy = zeros.index_put(where, token_ent) if token_ent is not None else None
    outside = None
    if token_out is not None:
        outside = torch.zeros(response_ids.shape, dtype=torch.bool, device=token_lp.device).index_put(where, token_out)
    return TokenLogprobs(logprobs=logprobs, entropy=entropy, outside=outside)
