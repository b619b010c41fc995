"""Log-prob of the target token under the LM head, computed in vocabulary chunks that are never all kept.

The plain form, ``head(hidden).float().log_softmax(-1)``, holds several ``[T, V]`` fp32 tensors (the logits, their
exponentials, what softmax's autograd saves, its gradient): 0.8 GB each at ``T`` = 4k tokens and SmolLM2's ``V`` =
49k. :class:`ChunkedTokenLogprob` runs the head over ``chunk`` tokens at a time, keeps only the per-token
log-normaliser and recomputes each chunk's logits in the backward pass, as Liger's fused linear cross-entropy does.
It is the same function: the same forward per token, and the analytic gradient
``d log p(y) / d z = onehot(y) - softmax(z)`` over ``temperature``. The entropy ``H = logsumexp(z) - sum_k p_k z_k``
has a gradient only when asked for (an entropy bonus), then ``d H / d z_k = -p_k (z_k - sum_j p_j z_j)`` joins the
same pass. Chunking saves memory, not time (``benchmarks/micro/kernels.py lm-head``). Under autocast the matmuls run in
the autocast dtype and the rest in fp32, as ``head(hidden).float()`` does.

Every chunk's ``[c, V]`` intermediates are written into scratch buffers allocated once per call
(:class:`_LogitScratch`), and the ``[V, H]`` weight gradient accumulates in place (``addmm_``, or ``add_`` of the
compute-dtype product): a fresh 64 MiB tensor per step of the loop costs its page faults every time, and the
weight gradient's per-chunk cast and sum were three passes over ``V x H``. The forward keeps the exponentials of
its ``logsumexp`` for the entropy (``H = logZ - sum_k e_k z_k / sum_k e_k``, ``e = exp(z - max z)``) instead of a
second ``exp`` pass. Same values: the log-prob and the gradients as before bit for bit in bf16, the entropy to
rounding (closer to a float64 reference than ``logZ - sum_k p_k z_k`` on peaked distributions, where both cancel);
measured faster in ``benchmarks/micro/learner_levers.py`` (benchmarks/README.md, levers table).

**Sampling truncation.** With ``top_k > 0`` or ``top_p < 1`` the engine reports log-probs of the truncated
distribution (vLLM's ``processed_logprobs``, transformers' processed scores: tempered, then top-k, then top-p, the
kept tokens renormalised by their mass ``Z``). Scored untruncated, each sampled token's learner/engine ratio would
be ``Z < 1``, which the engine correction reads as drift (``benchmarks/micro/truncation_ratio.py``).
:class:`TruncatedTokenLogprob` scores under the same truncation, with the kept set of vLLM v1's
``apply_top_k_top_p`` (:func:`truncation_threshold`): ``log p~(y) = z_y - logsumexp(z over the kept set)``, gradient
``onehot(y) - p~`` (the set a constant) over ``temperature``, the entropy the truncated distribution's. Departure
from vLLM: the kept set is one threshold per row (``z >= threshold``), so tokens tied at the top-p boundary are all
kept (vLLM keeps those its sort puts last); the backward pass recomputes the set from the recomputed logits.

A sampled token outside the learner's own kept set (its weights or numerics differ from the engine's) would get
``-inf``. It gets the untruncated log-prob, entropy and gradient as finite stand-ins, is flagged ``outside``, and
the loss gives it weight 0 (:func:`grpo_rl.algo.loss.grpo_loss`; logged as ``truncation_masked_fraction``): its
ratio against the engine would be meaningless, and a token the policy would no longer sample carries no on-policy
signal.

Only the policy's log-probs are truncated. The reference's stay untruncated (:mod:`grpo_rl.training.reference`):
its own top-p set need not hold the sampled token, which would make the KL infinite. So with equal models at step 0
the KL is not 0: ``log(ref / policy) = log Z`` for every sampled token, k1 reads ``-log Z`` and k3
``Z - 1 - log Z`` (k3 is unbiased only when the reference's mass on the policy's support is 1; here it is ``Z``).

Cost: without truncation :class:`ChunkedTokenLogprob` runs unchanged. With it, the forward pass also finds each
chunk's kept set with ``topk`` (the whole vocabulary sorted only for rows whose top-p set outgrows
:data:`TOP_P_CANDIDATES`; with flat distributions top-p costs about that sort), and both passes mask the
``[c, V]`` logits. Measured by ``benchmarks/micro/kernels.py truncation`` (benchmarks/README.md, "Sampling truncation
and the importance ratio").
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 24
"""Logits per chunk (64 MiB in fp32): ``chunk = CHUNK_ELEMENTS // V`` tokens."""


def _compute_dtype(device_type: str, fallback: torch.dtype) -> torch.dtype:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return fallback


class _LogitScratch:
    """Scratch for the ``[chunk, V]`` intermediates of one call, reused by every chunk (fresh pages per chunk cost
    more than the passes that fill them), and for the compute-dtype ``[V, H]`` weight-gradient product."""

    def __init__(self, rows: int, vocab: int, dtype: torch.dtype, device: torch.device, extra: int = 1):
        self.logits = torch.empty(rows, vocab, dtype=dtype, device=device)  # [c, V] the matmul's output
        self.logits_fp32 = torch.empty(rows, vocab, device=device) if dtype != torch.float32 else None  # [c, V]
        self.work = [torch.empty(rows, vocab, device=device) for _ in range(extra)]  # [c, V] fp32 each
        self.weight_grad: torch.Tensor | None = None  # [V, H] compute dtype, made on first use

    def chunk_logits(self, hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
        """``[c, V]`` fp32 tempered logits of one chunk; ``hidden`` and ``weight`` already in the compute dtype."""
        c = hidden.shape[0]
        z = torch.mm(hidden, weight.t(), out=self.logits[:c])
        if self.logits_fp32 is not None:
            z = self.logits_fp32[:c].copy_(z)
        return z.div_(temperature) if temperature != 1.0 else z

    def grad_in_compute_dtype(self, gz: torch.Tensor) -> torch.Tensor:
        """``gz`` (``[c, V]`` fp32) in the compute dtype, written over the compute-dtype logits (used by then)."""
        if self.logits_fp32 is None:
            return gz
        return self.logits[: gz.shape[0]].copy_(gz)

    def accumulate_weight_grad(self, grad_weight: torch.Tensor, gz: torch.Tensor, h: torch.Tensor, first: bool) -> None:
        """``grad_weight [V, H] (fp32) (+)= gz.t() @ h``, in place; the product rounded to the compute dtype first,
        as ``(gz.t() @ h).float()`` is."""
        if gz.dtype == torch.float32:
            if first:
                torch.mm(gz.t(), h, out=grad_weight)
            else:
                grad_weight.addmm_(gz.t(), h)
            return
        if self.weight_grad is None:
            self.weight_grad = torch.empty(grad_weight.shape, dtype=gz.dtype, device=gz.device)
        product = torch.mm(gz.t(), h, out=self.weight_grad)  # [V, H]
        if first:
            grad_weight.copy_(product)
        else:
            grad_weight.add_(product)


def _logit_grad(
    p: torch.Tensor,
    z: torch.Tensor,
    g: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """The gradient w.r.t. one chunk's raw logits (module docstring), overwriting ``p``, the softmax of ``z``
    ``[c, V]``; a truncated ``p`` (0 off the kept set) gives the truncated distribution's gradient."""
    if grad_entropy is not None:
        ge = grad_entropy.float().unsqueeze(-1)  # [c, 1]
        mean_z = (p * z).sum(-1, keepdim=True)  # [c, 1]
        gz = p.mul_(-(g.unsqueeze(-1) + ge * (z - mean_z)))  # [c, V]
    else:
        gz = p.mul_(-g.unsqueeze(-1))  # [c, V]
    gz.scatter_add_(-1, targets.unsqueeze(-1), g.unsqueeze(-1))
    if temperature != 1.0:
        gz.div_(temperature)
    return gz


class ChunkedTokenLogprob(torch.autograd.Function):
    """``(hidden [T, H], weight [V, H], targets [T])`` -> ``(logprob [T], entropy [T] or None)``, chunked over
    ``T``; the entropy carries a gradient only with ``entropy_grad``."""

    @staticmethod
    def forward(
        ctx, hidden, weight, targets, temperature: float, with_entropy: bool, chunk: int, entropy_grad: bool = False
    ):
        dtype = _compute_dtype(hidden.device.type, hidden.dtype)
        w = weight.to(dtype)
        n = hidden.shape[0]
        logprob = hidden.new_empty(n, dtype=torch.float32)
        logz = torch.empty_like(logprob)
        entropy = torch.empty_like(logprob) if with_entropy else None
        scratch = _LogitScratch(min(chunk, n), weight.shape[0], dtype, hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                z = scratch.chunk_logits(hidden[s : s + chunk].to(dtype), w, temperature)  # [c, V]
                c = z.shape[0]
                # torch.logsumexp's own steps, keeping its exponentials for the entropy.
                m = z.amax(-1, keepdim=True)  # [c, 1]
                m.masked_fill_(m.abs() == float("inf"), 0.0)
                e = torch.sub(z, m, out=scratch.work[0][:c]).exp_()  # [c, V]
                sum_e = e.sum(-1)  # [c]
                lz = sum_e.log().add_(m.squeeze(-1))  # [c]
                logz[s : s + c] = lz
                logprob[s : s + c] = z.gather(-1, targets[s : s + c].unsqueeze(-1)).squeeze(-1) - lz
                if entropy is not None:
                    entropy[s : s + c] = lz - e.mul_(z).sum(-1) / sum_e
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
        n = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:  # written whole by the first chunk; zeros when there is none
            grad_weight = (torch.empty if n else torch.zeros)(weight.shape, dtype=torch.float32, device=weight.device)
        scratch = _LogitScratch(min(chunk, n), weight.shape[0], dtype, hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                h = hidden[s : s + chunk].to(dtype)  # [c, H]
                z = scratch.chunk_logits(h, w, temperature)  # [c, V]
                c = z.shape[0]
                g = grad_logprob[s : s + c].float()  # [c]
                # d logprob / d z = onehot(y) - softmax(z); then through z = logits / temperature.
                p = torch.sub(z, logz[s : s + c].unsqueeze(-1), out=scratch.work[0][:c]).exp_()  # [c, V]
                ge = grad_entropy[s : s + c] if ctx.entropy_grad else None
                gz = scratch.grad_in_compute_dtype(_logit_grad(p, z, g, ge, targets[s : s + c], temperature))
                if grad_hidden is not None:
                    grad_hidden[s : s + c] = (gz @ w).to(hidden.dtype)
                if grad_weight is not None:
                    scratch.accumulate_weight_grad(grad_weight, gz, h, first=s == 0)  # [V, H]
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def is_truncated(top_p: float, top_k: int) -> bool:
    """Whether ``top_p`` / ``top_k`` truncate the sampling distribution at all."""
    return top_p < 1.0 or top_k > 0


TOP_P_CANDIDATES = (256, 4096)
"""Top-p alone looks for its kept set among the 256 largest logits of each row (``topk`` is far cheaper than a sort
of the vocabulary; ``benchmarks/micro/kernels.py truncation``), then among the 4096 largest for rows that keep more, and
sorts the rest whole (at once when more than half the rows are left: flat distributions)."""


def top_p_threshold_sorted(zs: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM's top-p over ascending-sorted logits ``zs [c, m]`` (``-inf`` where top-k removed a token): the softmax's
    cumulative sum, tokens where it is ``<= 1 - top_p`` dropped (``1 - top_p`` in fp32, as vLLM forms it), the
    largest always kept. Returns ``[c]``, the smallest kept logit."""
    cum = zs.softmax(dim=-1).cumsum_(dim=-1)  # [c, m], non-decreasing, so the dropped tokens are a prefix
    limit = 1.0 - torch.tensor(top_p, dtype=torch.float32, device=zs.device)
    dropped = (cum <= limit).sum(-1).clamp_(max=zs.shape[-1] - 1)  # [c]
    return zs.gather(-1, dropped.unsqueeze(-1)).squeeze(-1)


def truncation_threshold(z: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """``[c]``: the smallest logit each row of the tempered fp32 logits ``z [c, V]`` keeps under vLLM v1's
    ``apply_top_k_top_p`` (top-k keeps ``>=`` the k-th largest, then top-p as :func:`top_p_threshold_sorted`);
    the kept set is ``z >= threshold`` (``-inf``: all).

    The vocabulary is sorted only where it must be: top-p alone keeps a token when the mass of the larger ones is
    ``< top_p`` (vLLM's ascending sum up to a token is 1 minus that mass), searched among the
    :data:`TOP_P_CANDIDATES` largest logits. Summed in another order than vLLM's, a token whose cumulative mass lies
    within float rounding (~1e-7) of ``1 - top_p`` can fall on the other side.
    """
    v = z.shape[-1]
    k = top_k if 0 < top_k < v else 0
    if k:
        # [c, k] descending; no sort of the vocabulary, as vLLM's top-k-only path. Top-p then runs on these k exactly
        # as vLLM's does: the tokens top-k removed add zeros to its sums.
        top = z.topk(k, dim=-1).values
        if top_p >= 1.0:
            return top[:, -1]
        return top_p_threshold_sorted(top.flip(-1), top_p)
    if top_p >= 1.0:
        return z.new_full(z.shape[:1], float("-inf"))
    threshold = z.new_empty(z.shape[:1])
    logz = torch.logsumexp(z, dim=-1, keepdim=True)  # [c, 1]
    rows = None  # all of them
    for n in TOP_P_CANDIDATES:
        n = min(n, v)
        zr, lz = (z, logz) if rows is None else (z[rows], logz[rows])
        top = zr.topk(n, dim=-1).values  # [r, n] descending
        probs = (top - lz).exp_()  # [r, n]
        above = torch.cat([probs.new_zeros(probs.shape[0], 1), probs[:, :-1]], dim=-1).cumsum_(dim=-1)
        kept = (above < top_p).sum(-1)  # [r], >= 1: no mass is above the largest
        thr = top.gather(-1, (kept - 1).unsqueeze(-1)).squeeze(-1)
        done = kept < n if n < v else torch.ones_like(kept, dtype=torch.bool)  # else it may extend past the n
        rows = torch.arange(z.shape[0], device=z.device) if rows is None else rows
        threshold[rows[done]] = thr[done]
        rows = rows[~done]
        if not rows.numel():
            return threshold
        if 2 * rows.numel() > z.shape[0]:  # flat rows: more candidates would not save their sort
            break
    if rows.numel() == z.shape[0]:
        return top_p_threshold_sorted(z.sort(dim=-1).values, top_p)
    threshold[rows] = top_p_threshold_sorted(z[rows].sort(dim=-1).values, top_p)
    return threshold


def _kept_logits(
    z: torch.Tensor, targets: torch.Tensor, top_p: float, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(kept [c, V], threshold [c], outside [c])`` of one chunk: the logits with the truncated-away ones at
    ``-inf``, the threshold, and where the target lies outside the kept set; those rows keep every logit (threshold
    ``-inf``), so that their log-prob, entropy and gradient are the untruncated ones."""
    threshold = truncation_threshold(z, top_p, top_k)
    outside = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) < threshold  # [c]
    if outside.any():
        threshold = threshold.masked_fill(outside, float("-inf"))
    return z.masked_fill(z < threshold.unsqueeze(-1), float("-inf")), threshold, outside


class TruncatedTokenLogprob(torch.autograd.Function):
    """:class:`ChunkedTokenLogprob` under top-k / top-p truncation (module docstring):
    ``(hidden, weight, targets, ...)`` -> ``(logprob [T], entropy [T], outside [T])``."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        targets,
        temperature: float,
        with_entropy: bool,
        chunk: int,
        entropy_grad: bool,
        top_p: float,
        top_k: int,
    ):
        dtype = _compute_dtype(hidden.device.type, hidden.dtype)
        w = weight.to(dtype)
        n = hidden.shape[0]
        logprob = hidden.new_empty(n, dtype=torch.float32)
        logz, threshold = torch.empty_like(logprob), torch.empty_like(logprob)
        outside = torch.empty(n, dtype=torch.bool, device=hidden.device)
        entropy = torch.empty_like(logprob) if with_entropy else None
        scratch = _LogitScratch(min(chunk, n), weight.shape[0], dtype, hidden.device, extra=0)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                z = scratch.chunk_logits(hidden[s : s + chunk].to(dtype), w, temperature)  # [c, V]
                y = targets[s : s + chunk]
                kept, thr, out = _kept_logits(z, y, top_p, top_k)  # [c, V], [c], [c]
                lz = torch.logsumexp(kept, dim=-1)  # [c]
                logz[s : s + chunk], threshold[s : s + chunk], outside[s : s + chunk] = lz, thr, out
                logprob[s : s + chunk] = z.gather(-1, y.unsqueeze(-1)).squeeze(-1) - lz
                if entropy is not None:
                    p = kept.sub_(lz.unsqueeze(-1)).exp_()  # [c, V], 0 off the kept set
                    entropy[s : s + chunk] = lz - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, logz, threshold)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        ctx.entropy_grad = entropy is not None and entropy_grad
        ctx.mark_non_differentiable(outside)
        if entropy is not None and not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy, outside

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy, _grad_outside):
        hidden, weight, targets, logz, threshold = ctx.saved_tensors
        dtype, chunk, temperature = ctx.dtype, ctx.chunk, ctx.temperature
        w = weight.to(dtype)
        n = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        )
        scratch = _LogitScratch(min(chunk, n), weight.shape[0], dtype, hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                h = hidden[s : s + chunk].to(dtype)  # [c, H]
                z = scratch.chunk_logits(h, w, temperature)  # [c, V]
                c = z.shape[0]
                g = grad_logprob[s : s + c].float()  # [c]
                p = scratch.work[0][:c].copy_(z).masked_fill_(z < threshold[s : s + c].unsqueeze(-1), float("-inf"))
                p = p.sub_(logz[s : s + c].unsqueeze(-1)).exp_()  # [c, V]: softmax over the kept set, 0 elsewhere
                ge = grad_entropy[s : s + c] if ctx.entropy_grad else None
                gz = scratch.grad_in_compute_dtype(_logit_grad(p, z, g, ge, targets[s : s + c], temperature))
                if grad_hidden is not None:
                    grad_hidden[s : s + c] = (gz @ w).to(hidden.dtype)
                if grad_weight is not None:
                    scratch.accumulate_weight_grad(grad_weight, gz, h, first=False)  # [V, H]
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def token_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    top_p: float = 1.0,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-prob (and optionally entropy) of ``targets`` ``[T]`` under ``head(hidden) / temperature``
    (``hidden`` ``[T, H]``), truncated by ``top_k`` / ``top_p`` (0 and 1: none) as the engine sampled.

    Returns:
        ``logprob [T]`` and ``entropy [T]`` (or None), both fp32, and ``outside [T]`` (None without truncation):
        targets outside the truncated set, whose log-prob and entropy are the untruncated stand-ins. The entropy
        has a gradient only with ``entropy_grad``.
    """
    truncated = is_truncated(top_p, top_k)
    if type(head) is torch.nn.Linear and head.bias is None:  # the kernels compute hidden @ weight.T only
        chunk = max(1, CHUNK_ELEMENTS // head.weight.shape[0])
        if truncated:
            return TruncatedTokenLogprob.apply(
                hidden,
                head.weight,
                targets,
                float(temperature),
                with_entropy,
                chunk,
                entropy_grad,
                float(top_p),
                int(top_k),
            )
        logprob, entropy = ChunkedTokenLogprob.apply(
            hidden, head.weight, targets, float(temperature), with_entropy, chunk, entropy_grad
        )
        return logprob, entropy, None
    logits = head(hidden).float()  # [T, V]
    if temperature != 1.0:
        logits = logits / temperature
    outside = None
    if truncated:
        with torch.no_grad():
            _, thr, outside = _kept_logits(logits, targets, top_p, top_k)
        kept = logits.masked_fill(logits < thr.unsqueeze(-1), float("-inf"))  # [T, V]
    else:
        kept = logits
    logz = torch.logsumexp(kept, dim=-1)  # [T]
    logprob = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = logz - (torch.softmax(kept, dim=-1) * logits).sum(-1)
    return logprob, entropy, outside
