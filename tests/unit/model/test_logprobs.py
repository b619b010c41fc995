"""Tests for grpo_rl.model.logprobs.sequence_logprobs against a plain, unpadded HF forward of each sequence."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.model.logprobs import sequence_logprobs

PROMPTS = [[11, 12, 13, 14, 15], [21, 22], [31, 32, 33]]
RESPONSES = [[101, 102, 103], [201, 202, 203, 204], [301]]
PAD = 0


def padded_batch(prompts=PROMPTS, responses=RESPONSES, pad=PAD) -> TensorDict:
    """Prompts left-padded, answers right-padded, as every engine returns them."""
    lp, lr = max(map(len, prompts)), max(map(len, responses))
    n = len(prompts)
    out = {
        k: torch.full((n, w), pad if "ids" in k else 0, dtype=torch.long)
        for k, w in (("prompt_ids", lp), ("prompt_mask", lp), ("response_ids", lr), ("response_mask", lr))
    }
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        out["prompt_ids"][i, lp - len(p) :] = torch.tensor(p)
        out["prompt_mask"][i, lp - len(p) :] = 1
        out["response_ids"][i, : len(r)] = torch.tensor(r)
        out["response_mask"][i, : len(r)] = 1
    return TensorDict(out, batch_size=[n])


@torch.no_grad()
def reference_logprobs(model, prompt, response, temperature=1.0):
    """log pi(response | prompt) per token from one unpadded forward, and the entropy at each position."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature  # [Lr, V]
    logp = torch.log_softmax(logits, -1)
    token = logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_unpadded_forward(tiny_model, temperature):
    tiny_model.eval()
    batch = padded_batch()
    with torch.no_grad():
        out = sequence_logprobs(tiny_model, batch, temperature=temperature, with_entropy=True)
    assert out.logprobs.shape == out.entropy.shape == batch["response_ids"].shape
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        want_lp, want_ent = reference_logprobs(tiny_model, p, r, temperature)
        # Values near ln(49152) = 10.8: fp32 kernels that sum in another order (AVX2 vs AVX-512 builds of the same
        # op) differ by about 1e-6 relative, so the tolerance is relative too.
        torch.testing.assert_close(out.logprobs[i, : len(r)], want_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.entropy[i, : len(r)], want_ent, atol=1e-5, rtol=1e-5)
        # zero at answer padding
        assert (out.logprobs[i, len(r) :] == 0).all()
        assert (out.entropy[i, len(r) :] == 0).all()
    assert (out.entropy >= 0).all()
    assert (out.logprobs <= 0).all()


def test_temperature_changes_the_result(tiny_model):
    batch = padded_batch()
    with torch.no_grad():
        hot = sequence_logprobs(tiny_model, batch, temperature=2.0).logprobs
        cold = sequence_logprobs(tiny_model, batch, temperature=1.0).logprobs
    assert not torch.allclose(hot, cold)


def test_entropy_optional_and_gradient_flows(tiny_model):
    out = sequence_logprobs(tiny_model, padded_batch())
    assert out.entropy is None
    out.logprobs.sum().backward()
    grads = [p.grad for p in tiny_model.parameters()]
    assert all(g is not None for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
