"""The chunked LM-head log-prob equals the plain ``log_softmax(head(h))`` form, values and gradients."""

import pytest
import torch

from grpo_rl.model.vocab import ChunkedTokenLogprob, token_logprobs


def _plain(hidden, weight, targets, temperature):
    logits = (hidden @ weight.t()).float() / temperature  # [T, V]
    logprob = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    return logprob, entropy


def _inputs(t=37, h=16, v=101, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (t,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 8, 37, 64])
def test_values_and_gradients_match_the_plain_form(temperature, chunk):
    hidden, weight, targets = _inputs()
    upstream = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(1))
    lp, ent = ChunkedTokenLogprob.apply(hidden, weight, targets, temperature, True, chunk)
    (lp * upstream).sum().backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = _plain(hidden, weight, targets, temperature)
    (ref_lp * upstream).sum().backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent.detach(), atol=1e-4, rtol=1e-4)  # summation order
    torch.testing.assert_close(gh, hidden.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gw, weight.grad, atol=1e-5, rtol=1e-4)
    assert not ent.requires_grad


def test_tied_head_accumulates_into_the_shared_weight():
    hidden, weight, targets = _inputs()
    head = torch.nn.Linear(16, 101, bias=False)
    with torch.no_grad():
        head.weight.copy_(weight)
    lp, ent, _ = token_logprobs(hidden, head, targets, with_entropy=False)
    assert ent is None
    lp.sum().backward()
    ref_lp, _ = _plain(hidden, weight, targets, 1.0)
    ref_lp.sum().backward()
    torch.testing.assert_close(head.weight.grad, weight.grad, atol=1e-5, rtol=1e-4)


def test_bf16_autocast_matches_the_plain_form_under_autocast():
    hidden, weight, targets = _inputs(t=64, h=32, v=257)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = ChunkedTokenLogprob.apply(hidden, weight, targets, 1.0, False, 16)
        ref = (hidden @ weight.t()).float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref, atol=1e-4, rtol=1e-4)
    lp.sum().backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    gh = hidden.grad.clone()
    hidden.grad = None
    ref.sum().backward()
    torch.testing.assert_close(gh, hidden.grad, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_gradient_matches_the_plain_form(temperature):
    # An entropy bonus back-propagates through the entropy as well as the log-prob, in the same chunked pass.
    hidden, weight, targets = _inputs()
    g = torch.Generator().manual_seed(2)
    up_lp, up_ent = torch.randn(hidden.shape[0], generator=g), torch.randn(hidden.shape[0], generator=g)
    lp, ent = ChunkedTokenLogprob.apply(hidden, weight, targets, temperature, True, 8, True)
    assert ent.requires_grad
    ((lp * up_lp).sum() + (ent * up_ent).sum()).backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = _plain(hidden, weight, targets, temperature)
    ((ref_lp * up_lp).sum() + (ref_ent * up_ent).sum()).backward()
    torch.testing.assert_close(gh, hidden.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw, weight.grad, atol=1e-4, rtol=1e-4)


def test_plain_head_entropy_has_a_gradient_only_when_asked():
    hidden, weight, targets = _inputs()
    head = torch.nn.Linear(16, 101, bias=True)  # a bias takes the plain path
    _, detached, _ = token_logprobs(hidden, head, targets, with_entropy=True)
    _, live, _ = token_logprobs(hidden, head, targets, with_entropy=True, entropy_grad=True)
    assert not detached.requires_grad and live.requires_grad
    torch.testing.assert_close(live.detach(), detached)
