"""The pieces of the ``lowmem`` preset (config/preset/lowmem.yaml): torchao's 8-bit AdamW behind
``optimizer.name``, an engine that generates with the learner's own model, a bf16 reference, and their config
checks."""

from __future__ import annotations

import io
import types

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.cli.entry import check_overrides
from grpo_rl.config.checks import validate_async
from grpo_rl.config.schema import GRPOConfig
from grpo_rl.engines.base import SamplingSpec
from grpo_rl.engines.transformers_engine import TransformersEngine
from grpo_rl.errors import ConfigError
from grpo_rl.model.optim import check_optimizer, make_optimizer
from grpo_rl.run.preflight import validate
from tests.unit.config.test_config import CONFIG_DIR, _compose

CPU = torch.device("cpu")
PROMPTS = [[1, 9690, 198, 22, 23, 24, 25], [1, 4093, 198]]


def base_cfg():
    return OmegaConf.structured(GRPOConfig)


@pytest.mark.parametrize("config_name", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_the_preset_applies_to_every_task_config(config_name):
    cfg = _compose(["+preset=lowmem"], name=config_name)
    validate(cfg)
    assert cfg.inference_model.engine == "transformers" and cfg.inference_model.share_weights
    assert cfg.optimizer.name == "adamw8bit" and cfg.ref_model.dtype == "auto"
    assert _compose(["+preset=lowmem", "optimizer.name=adamw"], name=config_name).optimizer.name == "adamw"


def test_the_command_line_knows_the_presets():
    check_overrides(["+preset=lowmem", "optimizer.lr=1e-5"])
    with pytest.raises(ConfigError, match="no preset 'lowmen'; the presets are lowmem"):
        check_overrides(["+preset=lowmen"])


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(64, 256, generator=g)), torch.nn.Parameter(torch.randn(256, generator=g))]


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    total = 0
    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                inner = (
                    [getattr(value, name) for name in value.__tensor_flatten__()[0]]
                    if hasattr(value, "__tensor_flatten__")
                    else [value]
                )
                total += sum(t.numel() * t.element_size() for t in inner)
    return total


def _steps(opt, params, grads) -> None:
    for grad in grads:
        for p, g in zip(params, grad, strict=True):
            p.grad = g.clone()
        opt.step()


@pytest.mark.slow
def test_adamw8bit_keeps_quarter_size_moments_and_follows_adamw():
    grads = [[torch.randn_like(p) for p in _params()] for _ in range(4)]
    exact, quant = _params(), _params()
    kwargs = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    a = make_optimizer(exact, "adamw", CPU, **kwargs)
    b = make_optimizer(quant, "adamw8bit", CPU, **kwargs)
    _steps(a, exact, grads)
    _steps(b, quant, grads)
    # The large tensor's moments are 8-bit codes plus one scale per block: under a third of fp32's bytes.
    big = 64 * 256
    assert _state_bytes(b) - 2 * 256 * 4 < 0.3 * 2 * big * 4, _state_bytes(b)
    start = _params()
    moved = (exact[0] - start[0]).abs().mean()
    assert moved > 1e-3  # the updates are large enough to compare
    # The quantized moments give nearly the same update: a small error relative to how far the weights moved.
    assert (quant[0] - exact[0]).abs().mean() < 0.05 * moved


@pytest.mark.slow
def test_adamw8bit_state_round_trips_a_checkpoint_and_resumes_bit_for_bit():
    params = _params()
    opt = make_optimizer(params, "adamw8bit", CPU, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    _steps(opt, params, [[torch.randn_like(p) for p in params] for _ in range(2)])
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # how grpo_rl.run.checkpoint reads a trainer state
    copy = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = make_optimizer(copy, "adamw8bit", CPU, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    resumed.load_state_dict(state)
    more = [[torch.randn_like(p) for p in params] for _ in range(2)]
    _steps(opt, params, more)
    _steps(resumed, copy, more)
    assert all(torch.equal(p, q) for p, q in zip(params, copy, strict=True))


def test_adamw8bit_without_a_compiler_is_a_config_error(monkeypatch):
    import grpo_rl.model.compile

    monkeypatch.setattr(grpo_rl.model.compile, "compiler_problem", lambda device_type: "InvalidCxxCompiler: no g++")
    with pytest.raises(ConfigError, match="optimizer.name=adamw8bit .* no g\\+\\+.*optimizer.name=adamw"):
        check_optimizer("adamw8bit", "cpu")
    check_optimizer("adamw", "cpu")  # the default needs no compiler


def test_unknown_optimizer_is_a_config_error():
    cfg = base_cfg()
    cfg.optimizer.name = "adam9bit"
    with pytest.raises(ConfigError, match="optimizer.name='adam9bit'.*adamw, adamw8bit"):
        validate(cfg)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"inference_model.engine": "vllm"}, "inference_model.engine=transformers"),
        ({"train_model.num_devices": 2}, "train_model.num_devices=1"),
        ({"train.compile": "auto"}, "train.compile=false"),
    ],
)
def test_shared_weights_needs_a_transformers_engine_beside_one_learner(change, message):
    cfg = base_cfg()
    cfg.inference_model.engine, cfg.inference_model.share_weights = "transformers", True
    validate(cfg)
    for key, value in change.items():
        group, name = key.split(".")
        setattr(getattr(cfg, group), name, value)
    with pytest.raises(ConfigError, match=f"share_weights=true needs {message}"):
        validate(cfg)


def test_shared_weights_is_refused_by_the_asynchronous_loop():
    cfg = base_cfg()
    cfg.inference_model.engine, cfg.inference_model.share_weights = "transformers", True
    with pytest.raises(ConfigError, match="run sota/grpo.py"):
        validate_async(cfg)


@pytest.mark.parametrize(
    "setting, bf16, expected",
    [
        (None, True, "float32"),
        ("auto", True, "bfloat16"),
        ("auto", False, "float32"),
        ("bfloat16", False, "bfloat16"),
    ],
)
def test_reference_dtype_follows_its_precision_under_auto(setting, bf16, expected):
    from grpo_rl.training.build import reference_dtype

    cfg = base_cfg()
    cfg.ref_model.dtype = setting
    run = types.SimpleNamespace(cfg=cfg, precision=types.SimpleNamespace(ref=types.SimpleNamespace(bf16=bf16)))
    assert reference_dtype(run) == expected


def test_a_sharing_engine_generates_with_the_learners_model(tiny_model_dir, tiny_model, tokenizer):
    own = TransformersEngine(str(tiny_model_dir), CPU)
    shared = TransformersEngine.sharing(tiny_model, tokenizer, CPU)
    spec = SamplingSpec(max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.9, seed=3)
    a, b = own.generate(PROMPTS, 3, spec), shared.generate(PROMPTS, 3, spec)
    assert torch.equal(a["response_ids"], b["response_ids"])
    torch.testing.assert_close(a["behavior_logprobs"], b["behavior_logprobs"], rtol=0, atol=1e-5)
    assert tiny_model.training  # generation leaves the learner's mode as it found it
    assert shared.model is tiny_model

    # The learner's update is what the next generation samples from, without a push; a push is a no-op.
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    shared.update_weights([(n, torch.zeros_like(p)) for n, p in tiny_model.named_parameters()])
    c = shared.generate(PROMPTS, 3, spec)
    assert not torch.equal(a["behavior_logprobs"], c["behavior_logprobs"])
    own.update_weights(tiny_model.named_parameters())
    torch.testing.assert_close(
        own.generate(PROMPTS, 3, spec)["behavior_logprobs"], c["behavior_logprobs"], rtol=0, atol=1e-5
    )


@pytest.mark.parametrize(
    "setting, bf16, optimizer, fails",
    [
        ("auto", True, "adamw", True),
        ("bfloat16", False, "adamw", True),
        ("auto", False, "adamw", False),
        ("auto", True, "adamw8bit", False),
        (None, True, "adamw", False),
    ],
)
def test_bf16_learner_weights_need_the_stochastically_rounding_optimizer(setting, bf16, optimizer, fails):
    from grpo_rl.training.build import check_learner_dtype

    cfg = base_cfg()
    cfg.train_model.dtype, cfg.optimizer.name = setting, optimizer
    if fails:
        with pytest.raises(ConfigError, match="optimizer.name=adamw8bit"):
            check_learner_dtype(cfg, bf16)
    else:
        check_learner_dtype(cfg, bf16)
