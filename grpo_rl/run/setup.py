"""The run's start: work out the settings other settings decide, check everything that can be checked
(:mod:`grpo_rl.run.preflight`), place the roles, load the tokenizer and the training environment, and say what the
run is; nothing here starts an engine or Ray. The config is final and read-only once :func:`make_run` returns."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import torch
from omegaconf import OmegaConf

from grpo_rl.config.checks import lora_push
from grpo_rl.config.schema import needs_reference_model
from grpo_rl.config.torchrl_keys import describe_torchrl_keys, resolve_torchrl_keys
from grpo_rl.envs import make_env
from grpo_rl.envs.rewards.custom import RewardFunction
from grpo_rl.model.loading import check_model_folder, load_tokenizer, resolve_model
from grpo_rl.model.precision import cpu_flags
from grpo_rl.placement.context import RunContext, plan_placement, resolve_run_precision
from grpo_rl.placement.devices import allocate_devices, available_cpus
from grpo_rl.run.lifecycle import check_run_folder
from grpo_rl.run.preflight import check_given_servers, check_reference_folder, check_roles, validate

log = logging.getLogger(__name__)


def make_run(cfg, run_dir: str | Path, mode: str = "sync", rewards: Sequence[RewardFunction] = ()) -> RunContext:
    """Derive the settings other settings decide, validate the config and the run folder, allocate devices, resolve
    the model and the precisions, and log what the run is, failing fast before any engine or Ray starts.

    On return ``cfg`` is final and read-only (``train.steps`` included, from ``train.prompt_epochs`` once the
    training environment, :attr:`RunContext.train_env`, is built); a part of the run that needs other settings
    makes a copy of its own.

    Args:
        mode: ``sync`` (sota/grpo.py) or ``async`` (sota/grpo-async.py); some settings suit one loop only.
        rewards: reward functions given as Python objects, checked now and added wherever an environment is built.
    """
    started = time.monotonic()
    rewards = tuple(rewards)
    resolve_torchrl_keys(cfg)  # first: the settings TorchRL's keys decide are then checked like the others
    validate(cfg, rewards, mode=mode)
    # Simulated workers sleep: they need no core of their own (grpo_rl/training/simulated.py).
    devices = allocate_devices(
        cfg, need_ref=needs_reference_model(cfg), num_cpus=1024 if cfg.simulate.enabled else None
    )
    precision = resolve_run_precision(cfg, devices)
    check_roles(cfg, devices, precision, mode)
    placement = plan_placement(cfg, devices, mode)
    if cfg.model.lora.enabled:  # auto -> what the engines take: the learner pushes it, the engines expect it
        engine_on_gpu = devices.inference[0].type == "cuda"
        cfg.model.lora.push = lora_push(cfg, engine_on_gpu=engine_on_gpu)
    run_dir = Path(run_dir)
    check_run_folder(cfg, run_dir)
    model_path = resolve_model(cfg.model.name, cfg.model.cache_dir)
    check_model_folder(model_path)
    if cfg.ref_model.path and needs_reference_model(cfg):
        check_reference_folder(cfg.ref_model.path, model_path)
    tokenizer = load_tokenizer(model_path)
    if cfg.inference_model.urls and cfg.inference_model.engine == "vllm_server":
        check_given_servers(cfg, model_path)
    run_dir.mkdir(parents=True, exist_ok=True)
    run = RunContext(
        cfg=cfg,
        run_dir=run_dir,
        devices=devices,
        model_path=model_path,
        tokenizer=tokenizer,
        precision=precision,
        placement=placement,
        mode=mode,
        started=started,
        rewards=rewards,
        engine_urls=tuple(cfg.inference_model.urls or ()),
    )
    torch.set_num_threads(placement.driver_threads)  # the driver's threads, set here once (actors: ActorSpec.enter)
    log.info("%s", describe_run(run, mode))
    if cfg.train.prompt_epochs is not None:  # the steps count the prompts: the training environment is built now
        run = replace(run, train_env=build_train_env(cfg, tokenizer, devices=devices, rewards=rewards))
    OmegaConf.set_readonly(cfg, True)  # the run's config from here on: nothing changes it
    return run


def describe_run(run: RunContext, mode: str) -> str:
    """What the run is, for the start-up log: loop, workload, model, devices, precision and why, outputs."""
    cfg = run.cfg
    loop = "synchronous, sota/grpo.py" if mode == "sync" else "asynchronous, sota/grpo-async.py"
    limit = f", stops after {cfg.train.max_time_minutes:g} min" if cfg.train.max_time_minutes else ""
    model = cfg.model.name if cfg.model.name == run.model_path else f"{cfg.model.name} ({run.model_path})"
    cpu = f" | CPU: {cpu_flags()}, {available_cpus()} cores" if not run.devices.on_gpu else ""
    mode_ = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    wandb = {"wandb": f"wandb {mode_}", "none": "no wandb"}
    steps = (
        f"{cfg.train.steps} steps"
        if cfg.train.prompt_epochs is None
        else f"{cfg.train.prompt_epochs:g} passes over the prompts (train.prompt_epochs) in steps"
    )
    lines = [
        f"GRPO ({loop}): {steps} of {cfg.env.prompts_per_step} {cfg.env.dataset} prompts x "
        f"{cfg.env.group_size} answers, up to {cfg.sampling.max_new_tokens} new tokens{limit}",
        f"  model:     {model}",
        f"  devices:   {run.devices.describe()}{cpu}",
        run.placement.describe(),
        f"  precision: {run.precision.describe()}",
        f"  outputs:   {run.run_dir} (metrics.jsonl, {wandb[cfg.logger.backend]}, checkpoints/)",
    ]
    if cfg.reward.scale != 1.0 or cfg.reward.bias != 0.0:
        lines.insert(
            -1,
            f"  reward:    (weighted sum of the components {cfg.reward.bias:+g}) * {cfg.reward.scale:g} "
            "(reward.bias, reward.scale); reward_unscaled_mean logs the sum",
        )
    lines[1:1] = [f"  torchrl:   {line}" for line in describe_torchrl_keys(cfg)]  # what TorchRL's keys set
    return "\n".join(lines)


def make_train_env(run: RunContext):
    """The training environment, built once by the driver before any engine starts: the one :func:`make_run`
    built, else built now."""
    if run.train_env is not None:
        return run.train_env
    return make_env(run.cfg, run.tokenizer, devices=run.devices, rewards=run.rewards)


def build_train_env(cfg, tokenizer, *, devices=None, rewards: Sequence[RewardFunction] = ()):
    """The training environment of :func:`make_train_env`, built before the config is final; with
    ``train.prompt_epochs`` it sets ``cfg.train.steps`` (:func:`resolve_prompt_epochs`)."""
    env = make_env(cfg, tokenizer, devices=devices, rewards=rewards)
    resolve_prompt_epochs(cfg, len(env))
    return env


def resolve_prompt_epochs(cfg, num_prompts: int) -> int:
    """Set ``cfg.train.steps`` to ``ceil(train.prompt_epochs * num_prompts / env.prompts_per_step)`` when
    ``train.prompt_epochs`` is set (it wins over ``train.steps``) and log it; returns the run's steps."""
    epochs = cfg.train.prompt_epochs
    if epochs is None:
        return cfg.train.steps
    per_step = cfg.env.prompts_per_step
    # On the decimal value (0.1 is 1/10, not the float above it), so a whole number of steps is not rounded up.
    steps = max(1, math.ceil(Fraction(repr(float(epochs))) * num_prompts / per_step))
    cfg.train.steps = steps
    log.info(
        "train.steps = %d (train.prompt_epochs=%g over %d prompts, %d per step)", steps, epochs, num_prompts, per_step
    )
    return steps
