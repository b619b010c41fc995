"""The learner and the reference scorer of this process, built from the run's placement and config slices.

The learner's loss settings come from ``policy`` and ``sampling`` as one
:class:`~grpo_rl.algo.loss.LossSettings`; its optimizer from ``optimizer``; its weights' dtype from
``train_model.dtype`` and the resolved precision.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from grpo_rl.algo.loss import LossSettings
from grpo_rl.config.checks import fused_projection_blockers, pushes_adapter
from grpo_rl.errors import ConfigError
from grpo_rl.model.fused import fuse_projections
from grpo_rl.model.loading import load_causal_lm
from grpo_rl.placement.context import RunContext
from grpo_rl.training.learner import Learner
from grpo_rl.training.reference import RefScorer


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators (before a learner is built, in every process)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_local_learner(run: RunContext, *, shard=None) -> Learner:
    """The learner on ``run.devices.train[0]``, in this process (one rank of a data-parallel group runs one too,
    see :mod:`grpo_rl.distributed.learner_group`). ``shard(model)``, if given, shards the model before the
    optimizer is built (FSDP2, :mod:`grpo_rl.distributed.sharding`)."""
    cfg = run.cfg
    model = load_causal_lm(run.model_path, run.devices.train[0], learner_dtype(run), trainable=True)
    if cfg.simulate.enabled:
        from grpo_rl.training.simulated import SimulatedLearner

        return SimulatedLearner(
            model,
            run.devices.train[0],
            seconds=cfg.simulate.training_seconds,
            jitter=cfg.simulate.jitter,
            batch_rows=cfg.env.prompts_per_step * cfg.env.group_size,
            epochs=cfg.train.updates_per_batch,
        )
    if shard is not None:
        shard(model)
    elif fuses_projections(cfg):
        fuse_projections(model)
    if cfg.model.lora.enabled:
        from grpo_rl.model.lora import apply_lora

        lora = cfg.model.lora
        model = apply_lora(model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules)
        if cfg.train_model.gradient_checkpointing:
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need an input grad
    loss = LossSettings.from_config(cfg.policy, cfg.sampling)
    return Learner(
        model,
        run.devices.train[0],
        loss,
        optimizer=cfg.optimizer.name,
        lr=cfg.optimizer.lr,
        weight_decay=cfg.optimizer.weight_decay,
        betas=(cfg.optimizer.beta1, cfg.optimizer.beta2),
        eps=cfg.optimizer.eps,
        warmup_steps=cfg.optimizer.warmup_steps,
        max_grad_norm=cfg.optimizer.max_grad_norm,
        micro_batch_tokens=cfg.train.micro_batch_tokens,
        epochs=cfg.train.updates_per_batch,
        bf16_autocast=run.precision.train.bf16,
        gradient_checkpointing=cfg.train_model.gradient_checkpointing,
        share_prompt=cfg.train.share_prompt,
        attention=cfg.train.packed_attention,
        compile=cfg.train.compile,
        total_steps=cfg.train.steps,
        push_adapter=pushes_adapter(cfg),
    )


def fuses_projections(cfg) -> bool:
    """Whether the learner's and the reference's projections are fused: ``train.fused_projections`` where the layers
    run eager and are neither adapter-wrapped nor sharded (the config checks refuse it elsewhere)."""
    return bool(cfg.train.fused_projections) and not fused_projection_blockers(cfg)


def _role_dtype(setting: str | None, bf16_precision: bool, model_dtype: str) -> str:
    if setting == "auto":
        return "bfloat16" if bf16_precision else model_dtype
    return setting or model_dtype


def check_learner_dtype(cfg, bf16_precision: bool) -> None:
    """``train_model.dtype`` that resolves to bf16 needs the optimizer that rounds stochastically."""
    setting = cfg.train_model.dtype
    if (
        setting is not None
        and cfg.optimizer.name == "adamw"
        and _role_dtype(setting, bf16_precision, cfg.model.dtype) == "bfloat16"
    ):
        raise ConfigError(
            f"train_model.dtype={setting} keeps the learner's weights in bf16 here, where "
            "optimizer.name=adamw would round most updates away; set optimizer.name=adamw8bit "
            "(stochastic rounding) or train_model.dtype=float32"
        )


def learner_dtype(run: RunContext) -> str:
    """The learner's weights (``train_model.dtype``; auto: bfloat16 where its pass runs in bf16)."""
    return _role_dtype(run.cfg.train_model.dtype, run.precision.train.bf16, run.cfg.model.dtype)


def reference_dtype(run: RunContext) -> str:
    """The reference's weights (``ref_model.dtype``; auto: bfloat16 where its pass runs in bf16)."""
    return _role_dtype(run.cfg.ref_model.dtype, run.precision.ref.bf16, run.cfg.model.dtype)


def make_ref_scorer(run: RunContext, learner: Learner | None = None) -> RefScorer | None:
    """The reference scorer: a frozen copy of the initial model (or of ``ref_model.path``), or, for LoRA,
    ``learner``'s model with its adapters disabled (no second copy)."""
    if not run.uses_ref:
        return None
    if run.cfg.simulate.enabled:
        from grpo_rl.training.simulated import SimulatedRefScorer

        sim = run.cfg.simulate
        return SimulatedRefScorer(
            seconds=sim.reference_seconds,
            jitter=sim.jitter,
            batch_rows=run.cfg.env.prompts_per_step * run.cfg.env.group_size,
        )
    if run.cfg.model.lora.enabled:
        from grpo_rl.training.reference import AdapterDisabledRefScorer

        if learner is None:
            raise ValueError(
                "model.lora.enabled=true: the reference is the learner's model; call make_ref_scorer(run, learner)"
            )
        return AdapterDisabledRefScorer(
            learner.model,
            learner.device,
            temperature=run.cfg.sampling.temperature,
            micro_batch_tokens=2 * run.cfg.train.micro_batch_tokens,
            bf16_autocast=run.precision.ref.bf16,
            share_prompt=run.cfg.train.share_prompt,
            attention=run.cfg.train.packed_attention,
        )
    device = run.devices.ref[0]
    path = str(Path(run.cfg.ref_model.path).expanduser()) if run.cfg.ref_model.path else run.model_path
    model = load_causal_lm(path, device, reference_dtype(run), trainable=False)
    if fuses_projections(run.cfg):
        fuse_projections(model)
    return RefScorer(
        model,
        device,
        temperature=run.cfg.sampling.temperature,
        micro_batch_tokens=2 * run.cfg.train.micro_batch_tokens,
        bf16_autocast=run.precision.ref.bf16,
        share_prompt=run.cfg.train.share_prompt,
        attention=run.cfg.train.packed_attention,
    )
