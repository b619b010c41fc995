"""Fused projections (grpo_rl/model/fused.py): the model's outputs, gradients and parameters as before."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_rl.model.fused import FollowerProjection, LeaderProjection, fuse_projections, is_fused

SIZES = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)


def models():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**SIZES, num_key_value_heads=2, attention_bias=True))
    qwen = Qwen2ForCausalLM(Qwen2Config(**SIZES, num_key_value_heads=2))  # biased q, k, v; unbiased MLP
    return {"llama": llama, "qwen2": qwen}


@pytest.fixture(params=["llama", "qwen2"])
def pair(request):
    plain = models()[request.param]
    fused = copy.deepcopy(plain)
    assert fuse_projections(fused) == 2 * SIZES["num_hidden_layers"]  # attention and MLP of each layer
    return plain, fused


def test_parameters_keep_their_names_shapes_and_storage(pair):
    plain, fused = pair
    assert [(n, p.shape) for n, p in plain.named_parameters()] == [(n, p.shape) for n, p in fused.named_parameters()]
    assert list(plain.state_dict()) == list(fused.state_dict())
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention.q_proj, LeaderProjection) and isinstance(attention.v_proj, FollowerProjection)
    assert attention.q_proj.followers[0].weight is attention.k_proj.weight  # one parameter, not a copy
    assert is_fused(fused) and not is_fused(plain)
    assert fuse_projections(fused) == 0  # fused once


def test_outputs_and_every_gradient_equal_the_unfused_model(pair):
    plain, fused = pair
    ids = torch.randint(0, SIZES["vocab_size"], (3, 19))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding in one row
    a = plain(input_ids=ids, attention_mask=mask).logits
    b = fused(input_ids=ids, attention_mask=mask).logits
    # the same products, summed in a GEMM of another width: equal to fp32 rounding
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    (a.float().square().mean()).backward()
    (b.float().square().mean()).backward()
    for (name, p), q in zip(plain.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_bf16_autocast_equals_the_unfused_model(pair):
    plain, fused = pair
    ids = torch.randint(0, SIZES["vocab_size"], (2, 11))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = plain(input_ids=ids).logits.float(), fused(input_ids=ids).logits.float()
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)


def test_gradient_checkpointing_recomputes_the_fused_layers(pair):
    plain, fused = pair
    for m in (plain, fused):
        m.train()
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, SIZES["vocab_size"], (2, 13))
    plain(input_ids=ids).logits.square().mean().backward()
    fused(input_ids=ids).logits.square().mean().backward()
    for p, q in zip(plain.parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-7)


def test_a_follower_called_alone_or_on_another_tensor_computes_its_own():
    plain = models()["llama"]
    fused = copy.deepcopy(plain)
    fuse_projections(fused)
    a, b = plain.model.layers[0].self_attn, fused.model.layers[0].self_attn
    x, y = torch.randn(2, 5, SIZES["hidden_size"]), torch.randn(2, 5, SIZES["hidden_size"])
    torch.testing.assert_close(b.k_proj(x), a.k_proj(x))  # nothing handed over
    torch.testing.assert_close(b.q_proj(x), a.q_proj(x))  # hands k and v their slices of x
    torch.testing.assert_close(b.k_proj(y), a.k_proj(y))  # another tensor: its own matmul, not x's slice
    torch.testing.assert_close(b.v_proj(y), F.linear(y, a.v_proj.weight, a.v_proj.bias))
    assert b.v_proj.handed is None  # what x left was dropped, not kept for a later call


def test_a_fused_model_saves_the_folder_an_unfused_one_loads(pair, tmp_path):
    plain, fused = pair
    with torch.no_grad():
        for p in fused.parameters():
            p.add_(0.01)
    fused.save_pretrained(tmp_path)
    loaded = type(plain).from_pretrained(tmp_path)
    for (name, p), q in zip(fused.named_parameters(), loaded.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)


def test_only_plain_linear_groups_are_fused():
    model = models()["llama"]
    mlp = model.model.layers[0].mlp
    mlp.up_proj = torch.nn.Sequential(mlp.up_proj)  # e.g. wrapped by an adapter library
    assert fuse_projections(model) == 2 * SIZES["num_hidden_layers"] - 1
    assert type(mlp.gate_proj) is torch.nn.Linear


def _cfg(model_dir, **overrides):
    from omegaconf import OmegaConf

    from grpo_rl.config.schema import GRPOConfig

    cfg = OmegaConf.structured(GRPOConfig)
    cfg.model.name = str(model_dir)
    cfg.inference_model.engine = "transformers"
    cfg.logger.backend = "none"
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


ON = {"train.fused_projections": True}


@pytest.mark.parametrize(
    ("overrides", "fused"),
    [
        ({}, False),  # off by default
        (ON, True),
        ({**ON, "train.compile": "auto"}, False),  # compiled later: the hand-over would be state in a traced graph
        ({**ON, "model.lora.enabled": True}, False),
        ({**ON, "train_model.sharding": "fsdp"}, False),
    ],
)
def test_the_setting_fuses_where_the_layers_run_eager(tiny_model_dir, overrides, fused):
    from grpo_rl.training.build import fuses_projections

    assert fuses_projections(_cfg(tiny_model_dir, **overrides)) is fused


def test_the_learner_and_reference_of_a_run_are_fused(tiny_model_dir, tmp_path):
    from grpo_rl.run.setup import make_run
    from grpo_rl.training.build import make_local_learner, make_ref_scorer

    run = make_run(_cfg(tiny_model_dir, **{**ON, "policy.kl_coef": 0.01}), tmp_path)
    learner = make_local_learner(run)
    assert is_fused(learner.model) and is_fused(make_ref_scorer(run, learner).model)
    names = [n for n, _ in learner.model.named_parameters()]
    assert "model.layers.0.self_attn.k_proj.weight" in names and "model.layers.0.mlp.up_proj.weight" in names


@pytest.mark.parametrize("blocker", ["train.compile=true", "model.lora.enabled=true", "train_model.sharding=fsdp"])
def test_true_where_it_cannot_run_is_one_config_error(tiny_model_dir, blocker):
    from grpo_rl.config.checks import check_values
    from grpo_rl.errors import ConfigError

    key, value = blocker.split("=")
    cfg = _cfg(tiny_model_dir, **{**ON, key: value})
    with pytest.raises(ConfigError, match=f"train.fused_projections=true cannot run with {key}"):
        check_values(cfg)
