"""After a weight push, the vLLM engine generates with exactly the learner's weights.

Checked through log-probs: the engine's log-probs of its sampled tokens equal the learner's own log-probs of
the same tokens (fp32, 1e-4), with prompts longer than one KV-cache block, so that a stale prefix cache would
show.
"""

from __future__ import annotations

import pytest
import torch

from grpo_rl.engines.base import SamplingSpec
from grpo_rl.model.loading import load_causal_lm
from grpo_rl.model.logprobs import sequence_logprobs

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_engine_matches_learner_after_update(tiny_model_dir, tokenizer):
    from grpo_rl.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_model_dir), torch.device("cpu"), max_model_len=1024, kv_cache_gb=1, seed=0)
    model = load_causal_lm(str(tiny_model_dir), torch.device("cpu"))
    prompts = [
        tokenizer.encode("The quick brown fox " * 80, add_special_tokens=False),  # ~400 tokens
        tokenizer.encode("Short prompt.", add_special_tokens=False),
    ]
    assert len(prompts[0]) > 300
    spec = SamplingSpec(max_new_tokens=24, temperature=0.8, seed=3)
    try:
        before = engine.generate(prompts, 3, spec)
        with torch.no_grad():
            lp = sequence_logprobs(model, before, temperature=0.8).logprobs
        assert torch.allclose(lp, before["behavior_logprobs"], atol=1e-4)

        # Move the learner's weights well away from the engine's, then push.
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        engine.update_weights(model.state_dict().items())
        after = engine.generate(prompts, 3, spec)  # same prompts: the prefix cache holds the old weights' KV
        with torch.no_grad():
            lp_after = sequence_logprobs(model, after, temperature=0.8).logprobs
        stale = (lp_after - after["behavior_logprobs"]).abs().max()
        assert stale < 1e-4, f"engine log-probs differ from the learner's by {stale:.2e} after the push"
        # And the push did change what the engine computes.
        assert not torch.equal(before["behavior_logprobs"], after["behavior_logprobs"])
    finally:
        engine.shutdown()


def test_engine_matches_a_lora_learner_after_each_adapter_push(tiny_model_dir, tokenizer):
    """A LoRA learner that pushes its adapter alone (model.lora.push=adapter), through the synchronous loop's
    in-place sync: after each of two pushes the engine samples with the new adapter on its unchanged base weights,
    its log-probs the learner's (1e-4, fp32), and a push carries the adapter's bytes, not the model's."""
    from grpo_rl.engines.vllm_engine import AdapterSlots, VLLMEngine
    from grpo_rl.weights.sync import InPlaceWeightSync
    from tests.integration.helpers import follow_adapter_pushes, lora_learner

    model, learner = lora_learner(tiny_model_dir)
    engine = VLLMEngine(
        str(tiny_model_dir), torch.device("cpu"), max_model_len=1024, kv_cache_gb=1, adapters=AdapterSlots(8.0, 4)
    )
    prompts = [tokenizer.encode("The quick brown fox " * 80, add_special_tokens=False), [1, 2, 3]]
    try:
        follow_adapter_pushes(engine, InPlaceWeightSync(engine).push, model, learner, prompts)
        model_bytes = sum(t.numel() * t.element_size() for t in model.get_base_model().state_dict().values())
        assert 0 < engine.adapters.bytes < model_bytes / 10
    finally:
        engine.shutdown()
