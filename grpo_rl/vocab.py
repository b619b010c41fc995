"""Log-prob of the target token under the LM head, computed in vocabulary chunks that are never all kept.

The plain form, ``logits = head(hidden).float(); logits.log_softmax(-1)``, materialises ``[T, V]`` fp32 tensors
(``V`` = 49k for SmolLM2) several times over: the logits, their exponentials, the softmax autograd saves and
its gradient. For ``T`` = 4k answer tokens each one is 0.8 GB (the passes over them were about a quarter of a bf16
training pass on the CPU; chunking does not make them cheaper, it stops them being held). :class:`ChunkedTokenLogprob`
instead runs the head over ``chunk`` tokens at a time, keeps only the log-normaliser per token, and recomputes
each chunk's logits in the backward pass (as Liger's fused linear cross-entropy does). The result is the same
function: the forward is the same sequence of operations per token, and the gradient is the analytic one,
``d log p(y) / d z = onehot(y) - softmax(z)``, scaled by ``1 / temperature``. The entropy
``H = logsumexp(z) - sum_k p_k z_k`` is returned without gradient unless asked for (an entropy bonus in the
loss), in which case its analytic gradient ``d H / d z_k = -p_k (z_k - sum_j p_j z_j)`` joins the same pass.

Under autocast the matmuls run in the autocast dtype and everything after them in fp32, as
``head(hidden).float()`` does.
"""
from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 24
"""Logits per chunk (64 MiB in fp32): ``chunk = CHUNK_ELEMENTS // V`` tokens."""


def _compute_dtype(device_type: str, fallback: torch.dtype) -> torch.dtype:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return fallback


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[c, V]`` fp32 tempered logits of one chunk; ``hidden`` and ``weight`` already in the compute dtype."""
    z = (hidden @ weight.t()).float()
    return z / temperature if temperature != 1.0 else z


class ChunkedTokenLogprob(torch.autograd.Function):
    """``(hidden [T, H], weight [V, H], targets [T])`` -> ``(logprob [T], entropy [T])``, chunked over ``T``.

    ``entropy`` is returned only when asked for, and carries a gradient only with ``entropy_grad``.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, chunk: int,
                entropy_grad: bool = False):
        dtype = _compute_dtype(hidden.device.type, hidden.dtype)
        w = weight.to(dtype)
        logprob = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        logz = torch.empty_like(logprob)
        entropy = torch.empty_like(logprob) if with_entropy else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                z = _chunk_logits(hidden[s : s + chunk].to(dtype), w, temperature)  # [c, V]
                lz = torch.logsumexp(z, dim=-1)  # [c]
                logz[s : s + chunk] = lz
                logprob[s : s + chunk] = z.gather(-1, targets[s : s + chunk].unsqueeze(-1)).squeeze(-1) - lz
                if entropy is not None:
                    p = (z - lz.unsqueeze(-1)).exp_()
                    entropy[s : s + chunk] = lz - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, logz)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        ctx.entropy_grad = entropy is not None and entropy_grad
        if entropy is not None and not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        hidden, weight, targets, logz = ctx.saved_tensors
        dtype, chunk, temperature = ctx.dtype, ctx.chunk, ctx.temperature
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s : s + chunk].to(dtype)  # [c, H]
                z = _chunk_logits(h, w, temperature)  # [c, V]
                g = grad_logprob[s : s + chunk].float()  # [c]
                # d logprob / d z = onehot(y) - softmax(z); then through z = logits / temperature.
                if ctx.entropy_grad:
                    p = (z - logz[s : s + chunk].unsqueeze(-1)).exp_()  # [c, V]
                    ge = grad_entropy[s : s + chunk].float().unsqueeze(-1)  # [c, 1]
                    mean_z = (p * z).sum(-1, keepdim=True)  # [c, 1]
                    # d H / d z = -p (z - E_p[z]), added to the log-prob's -p g.
                    gz = p.mul_(-(g.unsqueeze(-1) + ge * (z - mean_z)))  # [c, V]
                else:
                    gz = (z - logz[s : s + chunk].unsqueeze(-1)).exp_().mul_(-g.unsqueeze(-1))  # [c, V]
                gz.scatter_add_(-1, targets[s : s + chunk].unsqueeze(-1), g.unsqueeze(-1))
                if temperature != 1.0:
                    gz.div_(temperature)
                gz = gz.to(dtype)
                if grad_hidden is not None:
                    grad_hidden[s : s + chunk] = (gz @ w).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight += (gz.t() @ h).float()  # [V, H]
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def token_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and optionally entropy) of ``targets`` under ``head(hidden) / temperature``.

    Args:
        hidden: ``[T, H]`` hidden states that predict the targets.
        head: the LM head; a bias-free ``nn.Linear`` takes the chunked path, anything else the plain one.
        targets: ``[T]`` token ids.
        with_entropy: also return the entropy of each position's distribution.
        entropy_grad: give that entropy a gradient (for an entropy bonus); otherwise it is detached.

    Returns:
        ``logprob [T]`` and ``entropy [T]`` (or None), both fp32.
    """
    if type(head) is torch.nn.Linear and head.bias is None:
        chunk = max(1, CHUNK_ELEMENTS // head.weight.shape[0])
        return ChunkedTokenLogprob.apply(hidden, head.weight, targets, float(temperature), with_entropy, chunk,
                                         entropy_grad)
    logits = head(hidden).float()  # [T, V]
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)  # [T]
    logprob = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprob, entropy
