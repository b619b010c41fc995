"""Shared-prefix attention: a packed group row attended in three dense parts instead of one masked square.

A packed row (:mod:`grpo_rl.model.packing`) is ``[prompt | answer_1 | ... | answer_G | padding]``. Its dense mask asks
the attention kernel for ``S^2`` scores per head of which most are masked out, and the CPU flash kernel computes a
masked block like any other. What the row needs is three unmasked (or plainly causal) attentions:

1. the prompt attends to itself, causally (all groups' prompts as one batch, each at the start of its row);
2. every answer's queries attend to the prompt's keys, with no mask (a group's answers, laid end to end in its row,
   against its prompt: the prompt's keys and values are never copied ``G`` times);
3. every answer attends to itself, causally (all answers of the batch as one right-padded batch).

Parts 2 and 3 cover disjoint keys of the same queries, so their outputs merge by their log-sum-exps:
``lse = logaddexp(lse2, lse3)``, ``out = exp(lse2 - lse) * out2 + exp(lse3 - lse) * out3``. The backward is the
identity ring attention rests on: the flash backward of each part, given the *merged* output and log-sum-exp,
returns that part's exact share of the gradients (its softmax probabilities ``exp(s - lse)`` are the merged ones
restricted to its keys, and ``rowsum(dO * O)`` is the merged one). Right padding never reaches a real token: a real
query of a causal part sees only keys at or before it, and the padded queries get a zero output gradient.

The cost grows like ``G * (Lp * La + La^2)`` per group where the dense mask's grows like ``(Lp + G * La)^2``.

It runs through transformers' attention interface: :func:`prefix_attention` is registered as ``grpo_prefix``
(an ``sdpa`` model is switched to it for a packed forward, :func:`prefix_attention_for`), and it takes the layout as
the ``prefix_layout`` keyword the decoder passes down to every attention call. It needs torch's CPU flash kernel;
elsewhere the dense mask is used (:func:`supported`, ``train.packed_attention``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

NAME = "grpo_prefix"


@dataclass(frozen=True)
class PrefixLayout:
    """Where the parts of ``R`` packed rows of length ``S`` lie (``N`` answers in all, the longest ``La`` tokens).

    ``prompt_len`` ``[R]`` and ``answers_len`` ``[R]`` (the group's answer tokens, end to end) as Python ints, since
    each group's part 2 slices by them; ``answer_index`` ``[N * La]`` indexes the flattened ``[R * S]`` row positions
    of answer ``n``'s token ``t`` at ``n * La + t`` (padding points at position 0; it is never read as a real
    token); ``answer_valid`` ``[N * La]`` marks the real ones."""

    prompt_len: list[int]
    answers_len: list[int]
    num_answers: int
    answer_width: int
    answer_index: torch.Tensor
    answer_valid: torch.Tensor

    @staticmethod
    def build(prompt_len: list[int], answer_lens: list[list[int]], row_len: int, device: torch.device) -> PrefixLayout:
        """The layout of rows ``[prompt_g | answers of g]`` of length ``row_len``; ``answer_lens[g]`` lists group
        ``g``'s answer lengths (zero-length answers are left out)."""
        starts, lengths = [], []
        for g, (lp, lens) in enumerate(zip(prompt_len, answer_lens, strict=True)):
            offset = g * row_len + lp
            for n in lens:
                if n > 0:
                    starts.append(offset)
                    lengths.append(n)
                    offset += n
        width = max(lengths, default=1)
        t = torch.arange(width)
        start = torch.tensor(starts or [0], dtype=torch.long).unsqueeze(1)
        length = torch.tensor(lengths or [0], dtype=torch.long).unsqueeze(1)
        valid = t.unsqueeze(0) < length  # [N, La]
        index = torch.where(valid, start + t, torch.zeros_like(valid, dtype=torch.long))
        return PrefixLayout(
            prompt_len=list(prompt_len),
            answers_len=[sum(n for n in lens if n > 0) for lens in answer_lens],
            num_answers=len(lengths),
            answer_width=width,
            answer_index=index.flatten()[: len(lengths) * width].to(device),
            answer_valid=valid.flatten()[: len(lengths) * width].to(device),
        )


def supported(device: torch.device) -> bool:
    """Whether the shared-prefix kernel runs on ``device`` (torch's CPU flash attention)."""
    return device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _flash(q, k, v, causal: bool, scale: float):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _flash_backward(grad, q, k, v, out, lse, causal: bool, scale: float):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, causal, scale=scale
    )


def _to_answers(x: torch.Tensor, layout: PrefixLayout) -> torch.Tensor:
    """``[R, H, S, D]`` -> the answers as a batch ``[N, H, La, D]``."""
    r, h, s, d = x.shape
    flat = x.transpose(1, 2).reshape(r * s, h, d)
    return flat.index_select(0, layout.answer_index).view(layout.num_answers, layout.answer_width, h, d).transpose(1, 2)


def _from_answers(x: torch.Tensor, layout: PrefixLayout, like: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`_to_answers` into zeros shaped ``like`` ``[R, H, S, ...]`` (padding dropped)."""
    r, h, s = like.shape[:3]
    tail = x.shape[3:]
    flat = x.transpose(1, 2).reshape(layout.num_answers * layout.answer_width, h, *tail)
    keep = layout.answer_valid
    out = torch.zeros((r * s, h, *tail), dtype=x.dtype, device=x.device)
    out.index_copy_(0, layout.answer_index[keep], flat[keep])
    return out.view(r, s, h, *tail).transpose(1, 2)


class _SharedPrefixAttention(torch.autograd.Function):
    """Forward and backward of the three parts over ``q``, ``k``, ``v`` ``[R, H, S, D]`` (keys and values already
    repeated to the query heads)."""

    @staticmethod
    def forward(ctx, q, k, v, layout: PrefixLayout, scale: float):
        r, h, s, d = q.shape
        lp_max = max(layout.prompt_len)
        # 1. prompts, causal; each starts its row, so the first lp_max positions are a right-padded batch of them.
        out_p, lse_p = _flash(q[:, :, :lp_max], k[:, :, :lp_max], v[:, :, :lp_max], True, scale)
        # 3. answers as a batch, causal.
        qa, ka, va = _to_answers(q, layout), _to_answers(k, layout), _to_answers(v, layout)
        out_a, lse_a = _flash(qa, ka, va, True, scale)
        out = torch.zeros_like(q)  # [R, H, S, D]
        lse = torch.zeros((r, h, s), dtype=lse_p.dtype, device=q.device)
        out[:, :, :lp_max] = out_p
        lse[:, :, :lp_max] = lse_p
        out3 = _from_answers(out_a, layout, q).to(lse.dtype)
        lse3 = _from_answers(lse_a.unsqueeze(-1), layout, q).squeeze(-1)
        # 2. each group's answers against its prompt, merged with part 3 by log-sum-exp.
        for g, (lp, n) in enumerate(zip(layout.prompt_len, layout.answers_len, strict=True)):
            if n == 0:
                continue
            sl = slice(lp, lp + n)
            o2, l2 = _flash(q[g : g + 1, :, sl], k[g : g + 1, :, :lp], v[g : g + 1, :, :lp], False, scale)
            l3 = lse3[g : g + 1, :, sl]
            merged = torch.logaddexp(l2, l3)
            o = o2.to(merged.dtype) * (l2 - merged).exp().unsqueeze(-1)
            o = o + out3[g : g + 1, :, sl] * (l3 - merged).exp().unsqueeze(-1)
            out[g : g + 1, :, sl] = o.to(q.dtype)
            lse[g : g + 1, :, sl] = merged
        # Each part's own log-sum-exp where it holds no real query of its own (part 1 past a prompt, part 3's
        # padding): the gradient there is zero, and a finite exp(s - lse) keeps it zero rather than inf * 0.
        ctx.save_for_backward(q, k, v, out, lse, lse_p, lse_a)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, lse_p, lse_a = ctx.saved_tensors
        layout, scale = ctx.layout, ctx.scale
        lp_max = max(layout.prompt_len)
        grad = grad.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        # 1. prompts: the gradient of the positions past each prompt belongs to parts 2 and 3, so it is cut here.
        g_p = grad[:, :, :lp_max].clone()
        for g, lp in enumerate(layout.prompt_len):
            g_p[g, :, lp:] = 0
        pq, pk, pv = _flash_backward(
            g_p,
            q[:, :, :lp_max],
            k[:, :, :lp_max],
            v[:, :, :lp_max],
            out[:, :, :lp_max],
            lse_p,  # on the prompts it is the merged one: nothing else attends there
            True,
            scale,
        )
        dq[:, :, :lp_max] += pq
        dk[:, :, :lp_max] += pk
        dv[:, :, :lp_max] += pv
        # 3. answers as a batch, with the merged output and log-sum-exp (padding: a zero gradient).
        valid = layout.answer_valid.view(layout.num_answers, 1, layout.answer_width, 1)
        g_a = _to_answers(grad, layout) * valid
        aq, ak, av = _flash_backward(
            g_a.contiguous(),
            _to_answers(q, layout).contiguous(),
            _to_answers(k, layout).contiguous(),
            _to_answers(v, layout).contiguous(),
            _to_answers(out, layout).contiguous(),
            torch.where(valid.squeeze(-1), _to_answers(lse.unsqueeze(-1), layout).squeeze(-1), lse_a).contiguous(),
            True,
            scale,
        )
        dq += _from_answers(aq, layout, q)
        dk += _from_answers(ak, layout, k)
        dv += _from_answers(av, layout, v)
        # 2. each group's answers against its prompt.
        for g, (lp, n) in enumerate(zip(layout.prompt_len, layout.answers_len, strict=True)):
            if n == 0:
                continue
            sl, one = slice(lp, lp + n), slice(g, g + 1)
            cq, ck, cv = _flash_backward(
                grad[one, :, sl].contiguous(),
                q[one, :, sl].contiguous(),
                k[one, :, :lp].contiguous(),
                v[one, :, :lp].contiguous(),
                out[one, :, sl].contiguous(),
                lse[one, :, sl].contiguous(),
                False,
                scale,
            )
            dq[one, :, sl] += cq
            dk[one, :, :lp] += ck
            dv[one, :, :lp] += cv
        return dq, dk, dv, None, None


def shared_prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PrefixLayout, scale: float
) -> torch.Tensor:
    """Attention of packed group rows ``q``, ``k``, ``v`` ``[R, H, S, D]`` (module docstring); ``[R, H, S, D]``,
    zero at padding."""
    return _SharedPrefixAttention.apply(q, k, v, layout, scale)


def prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface: the shared-prefix parts when the forward carries ``prefix_layout``,
    else ``sdpa``. Returns ``([R, S, H, D], None)``."""
    from transformers.integrations.sdpa_attention import repeat_kv

    layout = kwargs.pop("prefix_layout", None)
    if layout is None:
        raise ValueError("grpo_prefix attention needs the packed rows' layout (the forward's prefix_layout keyword)")
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    # What sdpa gets from autocast (it is on its lower-precision list); the rotary embedding leaves q and k in
    # float32 and v in bf16, and the flash kernel takes one dtype.
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = shared_prefix_attention(query, key, value, layout, scale)
    return out.transpose(1, 2).contiguous(), None


_registered = False


def register() -> None:
    """Register ``grpo_prefix`` with transformers' attention interface (once per process). It has no mask function:
    transformers then builds no mask for it, which is the point."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, prefix_attention)
    _registered = True


_switch_lock = threading.Lock()
_switched: dict[int, tuple[Any, str, int]] = {}  # id(config) -> (config, its own implementation, forwards inside)


@contextlib.contextmanager
def prefix_attention_for(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` (an ``sdpa`` HF model) with ``grpo_prefix`` attention inside the block. Counted per config, so
    two threads' packed forwards of one model (a LoRA reference beside its learner) leave it switched until both
    are done; a forward of another kind meanwhile fails loudly (no layout) rather than attending wrongly."""
    register()
    configs = [m.config for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")]
    configs = list({id(c): c for c in configs}.values())
    with _switch_lock:
        for c in configs:
            _, own, inside = _switched.get(id(c), (c, c._attn_implementation, 0))
            _switched[id(c)] = (c, own, inside + 1)
            c._attn_implementation = NAME
    try:
        yield
    finally:
        with _switch_lock:
            for c in configs:
                _, own, inside = _switched.pop(id(c))
                if inside > 1:
                    _switched[id(c)] = (c, own, inside - 1)
                else:
                    c._attn_implementation = own
