"""The LM head's reused scratch buffers and in-place weight-gradient sum (grpo_rl.model.vocab) give what fresh
per-chunk tensors gave: bit for bit in bf16 for the log-prob and both gradients, the entropy to summation order."""

import pytest
import torch

from grpo_rl.model.vocab import ChunkedTokenLogprob, TruncatedTokenLogprob


def _per_chunk(hidden, weight, targets, temperature, chunk, dtype):
    """The chunked head written out with fresh tensors per chunk: ``(logprob, entropy, grad_hidden, grad_weight)``
    for an upstream gradient of ones, the weight gradient summed chunk by chunk in fp32 from compute-dtype products."""
    w = weight.detach().to(dtype)
    lps, ents, ghs = [], [], []
    gw = torch.zeros(weight.shape)
    for s in range(0, hidden.shape[0], chunk):
        h = hidden.detach()[s : s + chunk].to(dtype)
        y = targets[s : s + chunk]
        z = (h @ w.t()).float() / temperature  # [c, V]
        lz = torch.logsumexp(z, -1)
        p = (z - lz.unsqueeze(-1)).exp()
        lps.append(z.gather(-1, y.unsqueeze(-1)).squeeze(-1) - lz)
        ents.append(lz - (p * z).sum(-1))
        gz = -p
        gz.scatter_add_(-1, y.unsqueeze(-1), torch.ones(len(y), 1))
        gz = (gz / temperature if temperature != 1.0 else gz).to(dtype)  # d logprob / d logits
        ghs.append((gz @ w).float())
        gw += (gz.t() @ h).float()
    return torch.cat(lps), torch.cat(ents), torch.cat(ghs), gw


def _inputs(t, h=32, v=257, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    return hidden, weight, torch.randint(0, v, (t,), generator=g)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 16, 27, 100])  # 27 leaves a short last chunk; 100 covers all 64 tokens
def test_bf16_autocast_is_bit_identical_to_fresh_per_chunk_tensors(temperature, chunk):
    hidden, weight, targets = _inputs(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = ChunkedTokenLogprob.apply(hidden, weight, targets, temperature, True, chunk)
    lp.sum().backward()
    want_lp, want_ent, want_gh, want_gw = _per_chunk(hidden, weight, targets, temperature, chunk, torch.bfloat16)
    assert torch.equal(lp, want_lp)
    assert torch.equal(hidden.grad, want_gh)
    assert torch.equal(weight.grad, want_gw)
    torch.testing.assert_close(ent, want_ent, atol=1e-4, rtol=1e-4)  # exp(z - max) / sum instead of exp(z - logZ)


@pytest.mark.parametrize("chunk", [1, 27, 100])
def test_fp32_matches_fresh_per_chunk_tensors(chunk):
    hidden, weight, targets = _inputs(64)
    lp, ent = ChunkedTokenLogprob.apply(hidden, weight, targets, 0.7, True, chunk)
    lp.sum().backward()
    want_lp, want_ent, want_gh, want_gw = _per_chunk(hidden, weight, targets, 0.7, chunk, torch.float32)
    torch.testing.assert_close(lp, want_lp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, want_ent, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(hidden.grad, want_gh, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weight.grad, want_gw, atol=1e-5, rtol=1e-5)  # addmm_ sums in another order


@pytest.mark.parametrize("cls,extra", [(ChunkedTokenLogprob, ()), (TruncatedTokenLogprob, (False, 0.9, 5))])
def test_no_tokens_give_a_zero_weight_gradient(cls, extra):
    hidden, weight, targets = _inputs(0)
    out = cls.apply(hidden, weight, targets, 1.0, False, 8, *extra)
    (out[0].sum() + (hidden.sum() * 0)).backward()
    assert out[0].shape == (0,)
    assert weight.grad is not None and torch.equal(weight.grad, torch.zeros_like(weight))
