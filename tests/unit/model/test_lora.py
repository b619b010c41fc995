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


def test_a_written_adapter_is_the_trained_one_to_peft(tiny_model_dir, tmp_path):
    """An adapter push, written as a peft folder with its config read off the tensors, is the trained adapter:
    peft loads it onto the base model and computes what the trained model does."""
    from peft import PeftModel

    from grpo_rl.model.lora import adapter_named_weights, is_adapter_push, write_adapter

    torch.manual_seed(0)
    model = _lora(load_causal_lm(str(tiny_model_dir), CPU, "float32", trainable=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B starts at 0: without this the adapter would change nothing
    named = adapter_named_weights(model)
    assert is_adapter_push(n for n, _ in named) and not is_adapter_push(merged_state_dict(model))
    assert not is_adapter_push([])
    written = write_adapter(tmp_path / "adapter", dict(named), alpha=8.0)
    assert written > sum(t.numel() * 4 for _, t in named)  # the fp32 tensors and a config
    loaded = PeftModel.from_pretrained(load_causal_lm(str(tiny_model_dir), CPU, "float32"), tmp_path / "adapter")
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    with torch.no_grad():
        base = load_causal_lm(str(tiny_model_dir), CPU, "float32")(input_ids=ids).logits
        want = model.eval()(input_ids=ids).logits
        got = loaded.eval()(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("engine", "given", "on_gpu", "push", "resolved"),
    [
        ("vllm", False, True, "auto", "adapter"),  # in the learner's process, a collector, or a server the run starts
        ("vllm_server", False, True, "auto", "adapter"),
        ("vllm", False, False, "auto", "merged"),  # vLLM's CPU adapter kernels: sampling 4.1x slower (AVX2)
        ("vllm_server", True, True, "auto", "merged"),  # the user's servers may run without --enable-lora
        ("vllm_server", True, True, "adapter", "adapter"),  # ... unless the user says they do
        ("transformers", False, True, "auto", "merged"),
        ("vllm", False, True, "merged", "merged"),
        ("vllm", False, False, "adapter", "adapter"),
    ],
)
def test_what_a_lora_push_carries_follows_the_engine(engine, given, on_gpu, push, resolved):
    from grpo_rl.config.checks import lora_push
    from tests.unit.helpers import compose_config

    urls = ["inference_model.urls=[http://127.0.0.1:8000]"] if given else []
    cfg = compose_config(
        ["model.lora.enabled=true", f"inference_model.engine={engine}", f"model.lora.push={push}", *urls]
    )
    assert lora_push(cfg, engine_on_gpu=on_gpu) == resolved


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["inference_model.engine=transformers"], "inference_model.engine=transformers"),
        (["simulate.enabled=true"], "simulate.enabled=true"),
    ],
)
def test_an_adapter_push_to_an_engine_that_cannot_load_one_is_refused(overrides, named):
    from grpo_rl.config.checks import check_values
    from grpo_rl.errors import ConfigError
    from tests.unit.helpers import compose_config

    cfg = compose_config(["model.lora.enabled=true", "model.lora.push=adapter", *overrides])
    with pytest.raises(ConfigError, match=f"model.lora.push=adapter with .*{named.split('=')[1]}.*push=auto"):
        check_values(cfg)
