"""LoRA: adapters train while the base stays frozen; the reference is the base with adapters off; merged weights
(for the engine and exports) equal the adapted model's function and leave it untouched; checkpoints round-trip."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.model.loading import load_causal_lm
from grpo_rl.model.logprobs import sequence_logprobs
from grpo_rl.model.lora import apply_lora, is_lora, merged_state_dict
from grpo_rl.run.checkpoint import Checkpointer, export_model, load_model_weights
from grpo_rl.training.learner import Learner, LossSettings
from grpo_rl.training.reference import AdapterDisabledRefScorer

pytest.importorskip("peft")

CPU = torch.device("cpu")
TARGETS = ["q_proj", "v_proj", "up_proj"]


def _lora(model):
    return apply_lora(model, r=4, alpha=8.0, dropout=0.0, target_modules=TARGETS)


def _batch(n: int = 4, lp: int = 5, lr: int = 6, vocab: int = 1000, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "prompt_ids": torch.randint(1, vocab, (n, lp), generator=g),
            "prompt_mask": torch.ones(n, lp, dtype=torch.long),
            "response_ids": torch.randint(1, vocab, (n, lr), generator=g),
            "response_mask": torch.ones(n, lr, dtype=torch.long),
            "advantage": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        },
        batch_size=[n],
    )


def _trained(model, steps: int = 2) -> Learner:
    """Train ``model`` for a few GRPO steps with nonzero advantages (on-policy behaviour log-probs)."""
    learner = Learner(model, CPU, LossSettings(kl_coef=0.0, tis_cap=None), lr=1e-2, warmup_steps=0)
    batch = _batch()
    for _ in range(steps):
        with torch.no_grad():
            batch["behavior_logprobs"] = sequence_logprobs(model, batch).logprobs
        learner.train_step(batch)
    return learner


def _logits(model, batch: TensorDict) -> torch.Tensor:
    with torch.no_grad():
        return sequence_logprobs(model, batch).logprobs


def test_only_adapters_train_and_base_stays_frozen(tiny_model):
    model = _lora(tiny_model)
    assert is_lora(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    learner = _trained(model)
    assert learner.version == 2
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable  # base weights bit-for-bit unchanged
    assert any(".lora_B." in n for n in changed)  # B starts at zero: it must have moved for the model to change


def test_reference_is_the_base_model_with_adapters_off(tiny_model, tiny_model_dir):
    model = _lora(tiny_model)
    _trained(model)
    batch = _batch()
    base = load_causal_lm(str(tiny_model_dir), CPU, trainable=False)
    ref = AdapterDisabledRefScorer(model, CPU, micro_batch_tokens=4096)
    ref.score(batch)
    torch.testing.assert_close(batch["ref_logprobs"], _logits(base, batch), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(_logits(model, batch), batch["ref_logprobs"], atol=1e-4)  # adapters back on after


def test_merged_weights_match_the_adapted_model_and_leave_it_unchanged(tiny_model, tiny_model_dir):
    model = _lora(tiny_model)
    _trained(model)
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state_dict(model)

    plain = load_causal_lm(str(tiny_model_dir), CPU, trainable=False)
    assert merged.keys() == plain.state_dict().keys()  # HF names, as the engine expects
    plain.load_state_dict(merged)
    batch = _batch(seed=1)
    torch.testing.assert_close(_logits(plain, batch), _logits(model, batch), rtol=1e-5, atol=1e-5)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state_before[key]), f"{key} changed by the merge"
    assert is_lora(model) and not any(m.merged for m in model.modules() if hasattr(m, "merged"))


def test_export_writes_a_merged_hf_folder_that_reloads(tiny_model, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    model = _lora(tiny_model)
    _trained(model)
    out = export_model(model, tokenizer, tmp_path / "merged")
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    from safetensors.torch import load_file

    assert not any("lora" in k or "base_layer" in k for k in load_file(out / "model.safetensors"))
    batch = _batch(seed=2)
    torch.testing.assert_close(_logits(reloaded, batch), _logits(model, batch), rtol=1e-5, atol=1e-5)


def test_lora_checkpoint_round_trip(tiny_model, tiny_model_dir, tokenizer, tmp_path):
    model = _lora(tiny_model)
    _trained(model)
    path = Checkpointer(tmp_path).save(2, model, tokenizer, {}, export_model_dir=False)
    assert (path / "adapter" / "adapter_model.safetensors").exists() and not (path / "model").exists()

    fresh = _lora(load_causal_lm(str(tiny_model_dir), CPU))
    load_model_weights(path, fresh)
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="LoRA"):
        load_model_weights(path, load_causal_lm(str(tiny_model_dir), CPU))
