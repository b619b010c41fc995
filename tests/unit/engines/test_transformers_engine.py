"""Tests for grpo_rl.engines.transformers_engine on the tiny model: batch layout, log-probs, weight updates."""

from __future__ import annotations

import pytest
import torch

from grpo_rl.engines.base import SamplingSpec
from grpo_rl.engines.transformers_engine import TransformersEngine
from grpo_rl.model.loading import load_causal_lm
from grpo_rl.model.logprobs import sequence_logprobs

CPU = torch.device("cpu")
PROMPTS = [[1, 9690, 198, 22, 23, 24, 25], [1, 4093, 198]]  # different lengths: left padding is exercised
MAX_NEW = 6


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = TransformersEngine(str(tiny_model_dir), CPU)
    yield eng
    eng.shutdown()


@pytest.fixture
def learner_model(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir), CPU, trainable=True)


def _learner_logprobs(model, batch, temperature):
    with torch.no_grad():
        return sequence_logprobs(model, batch, temperature=temperature).logprobs


def test_batch_layout(engine):
    batch = engine.generate(PROMPTS, 3, SamplingSpec(max_new_tokens=MAX_NEW, seed=0))
    n = len(PROMPTS) * 3
    assert batch.batch_size == torch.Size([n])
    assert {
        "prompt_ids",
        "prompt_mask",
        "response_ids",
        "response_mask",
        "behavior_logprobs",
        "group_id",
        "truncated",
    } <= set(batch.keys())
    lp = max(map(len, PROMPTS))
    assert batch["prompt_ids"].shape == batch["prompt_mask"].shape == (n, lp)
    lr = batch["response_ids"].shape[1]
    assert 1 <= lr <= MAX_NEW
    assert batch["response_mask"].shape == batch["behavior_logprobs"].shape == (n, lr)
    assert batch["prompt_ids"].dtype == batch["response_ids"].dtype == torch.long
    assert batch["behavior_logprobs"].dtype == torch.float32
    assert batch["group_id"].tolist() == [0, 0, 0, 1, 1, 1]
    for j in range(n):
        p = PROMPTS[j // 3]
        # prompt left-padded with the pad id
        assert batch["prompt_mask"][j].tolist() == [0] * (lp - len(p)) + [1] * len(p)
        assert batch["prompt_ids"][j, lp - len(p) :].tolist() == p
        assert (batch["prompt_ids"][j, : lp - len(p)] == engine.pad_id).all()
        # answer right-padded: a prefix of ones, zeros (and zero log-probs) after it
        r = int(batch["response_mask"][j].sum())
        assert r >= 1
        assert batch["response_mask"][j].tolist() == [1] * r + [0] * (lr - r)
        assert (batch["behavior_logprobs"][j, r:] == 0).all()
        assert (batch["behavior_logprobs"][j, :r] < 0).all()
        stopped = bool(set(batch["response_ids"][j, :r].tolist()) & engine.eos_ids)
        assert bool(batch["truncated"][j]) == (not stopped)
        if not stopped:
            assert r == MAX_NEW


def test_same_seed_same_samples(engine):
    spec = SamplingSpec(max_new_tokens=MAX_NEW, seed=123)
    a = engine.generate(PROMPTS, 2, spec)
    b = engine.generate(PROMPTS, 2, spec)
    assert torch.equal(a["response_ids"], b["response_ids"])
    c = engine.generate(PROMPTS, 2, SamplingSpec(max_new_tokens=MAX_NEW, seed=124))
    assert not torch.equal(a["response_ids"], c["response_ids"])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behavior_logprobs_match_learner(engine, learner_model, temperature):
    batch = engine.generate(PROMPTS, 2, SamplingSpec(max_new_tokens=MAX_NEW, temperature=temperature, seed=1))
    want = _learner_logprobs(learner_model, batch, temperature)
    torch.testing.assert_close(batch["behavior_logprobs"], want, atol=1e-4, rtol=0)


def test_update_weights_makes_engine_match_new_weights(tiny_model_dir, learner_model):
    engine = TransformersEngine(str(tiny_model_dir), CPU)  # its own, so the module's engine stays unperturbed
    spec = SamplingSpec(max_new_tokens=MAX_NEW, seed=2)
    old_batch = engine.generate(PROMPTS, 2, spec)
    old_learner = _learner_logprobs(learner_model, old_batch, 1.0)

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in learner_model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    new_learner = _learner_logprobs(learner_model, old_batch, 1.0)
    assert (new_learner - old_learner).abs().max() > 1e-2  # the perturbation matters

    engine.update_weights(learner_model.state_dict().items())
    batch = engine.generate(PROMPTS, 2, spec)
    torch.testing.assert_close(
        batch["behavior_logprobs"], _learner_logprobs(learner_model, batch, 1.0), atol=1e-4, rtol=0
    )
    engine.shutdown()
