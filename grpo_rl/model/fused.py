"""Fused projections: q, k and v in one matmul, gate and up in another, every parameter where it was.

A decoder layer calls ``q_proj``, ``k_proj`` and ``v_proj`` on one normalised hidden state, in that order (``gate_proj``
then ``up_proj`` in its MLP). After :func:`fuse_projections` the first module of each group computes the whole group
as one matmul over its weights concatenated, returns its own slice and hands each other module its slice, which that
module returns when it is next called on the same tensor. The input is then read (and under bf16 autocast cast) once
instead of three and two times, and the GEMMs are fewer and larger. The parameters stay the modules' own: their names,
shapes, the optimizer's state, checkpoints, exports and weight pushes see the model they saw before. A module called
first, or on another tensor, computes its own projection as before.

Not for models under LoRA (peft wraps these modules), FSDP (sharded weights) or ``torch.compile`` (the hand-over is
state between calls), nor for layers whose classes are not known to call the group in this order (:data:`GROUPS`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# transformers' layer classes that call each group's modules in this order on one tensor
_ATTENTION = ("q_proj", "k_proj", "v_proj")
_MLP = ("gate_proj", "up_proj")
GROUPS: dict[str, tuple[str, ...]] = {
    **{f"{arch}Attention": _ATTENTION for arch in ("Llama", "Mistral", "Qwen2", "Qwen3")},
    **{f"{arch}MLP": _MLP for arch in ("Llama", "Mistral", "Qwen2", "Qwen3")},
}


class _Projection(nn.Module):
    """A linear layer's parameters, under the names the model gives them."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class FollowerProjection(_Projection):
    """A group's later module: the slice its leader handed over for this input, else its own matmul."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self.handed: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handed, self.handed = self.handed, None
        if handed is not None and handed[0] is x:
            return handed[1]
        return F.linear(x, self.weight, self.bias)


class LeaderProjection(_Projection):
    """A group's first module: one matmul for the group, its own slice returned, the others handed over."""

    def __init__(self, linear: nn.Linear, followers: list[FollowerProjection]):
        super().__init__(linear)
        self.followers = tuple(followers)  # a plain attribute: their parameters are registered where they are

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = [self.weight, *(f.weight for f in self.followers)]
        bias = None if self.bias is None else torch.cat([self.bias, *(f.bias for f in self.followers)])
        own, *rest = F.linear(x, torch.cat(weights), bias).split([w.shape[0] for w in weights], dim=-1)
        for follower, part in zip(self.followers, rest, strict=True):
            follower.handed = (x, part)
        return own


def _fusable(linears: list[nn.Module]) -> bool:
    first = linears[0]
    return all(
        type(m) is nn.Linear
        and m.in_features == first.in_features
        and (m.bias is None) == (first.bias is None)
        and m.weight.dtype == first.weight.dtype
        and m.weight.device == first.weight.device
        for m in linears
    )


def fuse_projections(model: nn.Module) -> int:
    """Fuse every known group of ``model`` in place (:data:`GROUPS`); return how many were fused."""
    fused = 0
    for layer in list(model.modules()):
        names = GROUPS.get(type(layer).__name__)
        if names is None:
            continue
        linears = [getattr(layer, name, None) for name in names]
        if not _fusable(linears):
            continue
        followers = [FollowerProjection(m) for m in linears[1:]]
        setattr(layer, names[0], LeaderProjection(linears[0], followers))
        for name, follower in zip(names[1:], followers, strict=True):
            setattr(layer, name, follower)
        fused += 1
    return fused


def is_fused(model: nn.Module) -> bool:
    return any(isinstance(m, LeaderProjection) for m in model.modules())
