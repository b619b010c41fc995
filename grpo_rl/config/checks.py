"""Checks of config values that the schema's types cannot express: ranges, choices and combinations.

Pure functions of the config: no file, device or user code is touched here (that is
:mod:`grpo_rl.run.preflight`, which calls :func:`check_values` first). Each raises :class:`ConfigError` naming the
key and the fix. :func:`check_values` first sets what TorchRL's keys map to (:mod:`grpo_rl.config.torchrl_keys`,
which also reads which keys the command line gave).
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from grpo_rl.config.schema import (
    AGGREGATIONS,
    COMPILE_MODES,
    DATASETS,
    ENGINE_CORRECTIONS,
    IFEVAL_COMPONENTS,
    LOSS_TYPES,
    OPTIMIZERS,
    parse_compile_mode,
)
from grpo_rl.config.torchrl_keys import check_torchrl_keys
from grpo_rl.errors import ConfigError

log = logging.getLogger(__name__)


def _validate_engine_compile(cfg: Any) -> None:
    inf = cfg.inference_model
    if inf.compile and (inf.engine != "transformers" or inf.share_weights):
        raise ConfigError(
            "inference_model.compile=true compiles the transformers engine's own copy of the model: it "
            "needs inference_model.engine=transformers and inference_model.share_weights=false "
            "(vLLM compiles on its own: inference_model.enforce_eager=false)"
        )


def _validate_shared_weights(cfg: Any) -> None:
    """inference_model.share_weights: the engine generates with the learner's model, in the learner's process."""
    if not cfg.inference_model.share_weights:
        return
    why = None
    if cfg.inference_model.engine != "transformers":
        why = "inference_model.engine=transformers (vLLM keeps its own copy of the weights)"
    elif cfg.train_model.num_devices != 1 or cfg.train_model.devices and len(cfg.train_model.devices) != 1:
        why = "train_model.num_devices=1 (one learner, in the driver, with the engine)"
    elif cfg.inference_model.num_devices != 1 or cfg.inference_model.devices and len(cfg.inference_model.devices) != 1:
        why = "inference_model.num_devices=1"
    elif parse_compile_mode(cfg.train.compile) != "false":
        why = "train.compile=false (compiled layers would recompile for every decoding shape)"
    if why is not None:
        raise ConfigError(f"inference_model.share_weights=true needs {why}; or set inference_model.share_weights=false")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(choices)}")


def _positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")


def _finite(key: str, value: float) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value} must be a finite number")


def fused_projection_blockers(cfg: Any) -> list[str]:
    """The settings under which the learner's and the reference's projections cannot be fused (layers compiled,
    wrapped by LoRA or sharded): grpo_rl/model/fused.py."""
    blockers = {
        "train.compile": parse_compile_mode(cfg.train.compile) != "false",
        "model.lora.enabled": bool(cfg.model.lora.enabled),
        "train_model.sharding=fsdp": cfg.train_model.sharding == "fsdp",
    }
    return [name for name, blocks in blockers.items() if blocks]


def check_values(cfg: Any, rewards: Sequence[Any] = ()) -> None:
    """Check values that the schema's types cannot; raise :class:`ConfigError` naming the key and the fix.
    ``rewards``: reward functions given as Python objects (they count as the run's reward)."""
    check_torchrl_keys(cfg)  # first: the settings TorchRL's keys decide are then checked like the others
    _choice("model.dtype", cfg.model.dtype, ("float32", "bfloat16"))
    _choice("inference_model.engine", cfg.inference_model.engine, ("vllm", "vllm_server", "transformers"))
    for role in ("train_model", "ref_model", "inference_model"):
        _choice(f"{role}.precision", getattr(cfg, role).precision, ("auto", "float32", "bfloat16"))
    _choice("train_model.sharding", cfg.train_model.sharding, ("none", "fsdp"))
    _choice("train.compile", parse_compile_mode(cfg.train.compile), COMPILE_MODES)
    _choice("train.packed_attention", cfg.train.packed_attention, ("auto", "prefix", "dense"))
    if cfg.train.packed_attention == "prefix" and parse_compile_mode(cfg.train.compile) != "false":
        raise ConfigError(
            "train.packed_attention=prefix runs only in layers that are not compiled; set train.compile=false, "
            "or train.packed_attention=auto (prefix while eager, the dense mask once compiled)"
        )
    blockers = fused_projection_blockers(cfg)
    if cfg.train.fused_projections and blockers:
        raise ConfigError(
            f"train.fused_projections=true cannot run with {', '.join(blockers)} "
            "(compiled, adapter-wrapped or sharded layers); set train.fused_projections=false"
        )
    _choice("optimizer.name", cfg.optimizer.name, OPTIMIZERS)
    for role in ("train_model", "ref_model"):
        if getattr(cfg, role).dtype is not None:
            _choice(f"{role}.dtype", getattr(cfg, role).dtype, ("float32", "bfloat16", "auto"))
    _validate_shared_weights(cfg)
    _validate_engine_compile(cfg)
    _choice("ref_model.placement", cfg.ref_model.placement, ("auto", "learner", "actor"))
    if cfg.model.lora.enabled and cfg.ref_model.placement == "actor" and cfg.policy.kl_coef > 0:
        raise ConfigError(
            "ref_model.placement=actor with model.lora.enabled=true: a LoRA run's reference is the "
            "learner's own model with the adapters off; use ref_model.placement=auto"
        )
    if cfg.model.lora.enabled and cfg.ref_model.path:
        raise ConfigError(
            f"ref_model.path={cfg.ref_model.path} with model.lora.enabled=true: a LoRA run's reference is "
            "the policy with its adapters off; set ref_model.path=null, or train without LoRA"
        )
    if cfg.train_model.sharding == "fsdp" and cfg.model.lora.enabled:
        raise ConfigError(
            "train_model.sharding=fsdp with model.lora.enabled=true: a LoRA learner is small enough for "
            "one device; use train_model.sharding=none"
        )
    _choice("env.dataset", cfg.env.dataset, DATASETS)
    _validate_arithmetic(cfg)
    _choice("env.template", cfg.env.template, ("hash", "tags"))
    _choice("env.too_long_prompts", cfg.env.too_long_prompts, ("skip", "error"))
    _choice("policy.kl_estimator", cfg.policy.kl_estimator, ("k1", "k2", "k3"))
    resolve_loss_type(cfg.policy.loss_type, cfg.policy.aggregation)
    _choice("logger.backend", cfg.logger.backend, ("wandb", "none"))
    _validate_hub_dataset(cfg.env)
    if cfg.env.dataset == "file" and not cfg.env.path and not cfg.env.hub_dataset:
        raise ConfigError(
            "env.dataset=file needs env.path=/path/to/prompts.jsonl (or .parquet), or "
            "env.hub_dataset=<org/name> for a Hugging Face data set"
        )
    _validate_env_path(cfg.env.path)
    if cfg.env.group_size < 2:
        raise ConfigError(f"env.group_size={cfg.env.group_size}: GRPO needs at least 2 answers per prompt")
    for key in (
        "env.prompts_per_step",
        "env.max_prompt_tokens",
        "sampling.max_new_tokens",
        "train.steps",
        "train.micro_batch_tokens",
        "optimizer.lr",
        "inference_model.max_model_len",
    ):
        group, name = key.split(".")
        _positive(key, getattr(getattr(cfg, group), name))
    _validate_train_length(cfg.train)
    for key in (
        "policy.kl_coef",
        "policy.clip_eps_low",
        "policy.clip_eps_high",
        "optimizer.weight_decay",
        "optimizer.warmup_steps",
        "train.checkpoint_frequency",
        "optimizer.max_grad_norm",
    ):
        group, name = key.split(".")
        _positive(key, getattr(getattr(cfg, group), name), allow_zero=True)
    if cfg.policy.clip_eps_low >= 1.0:
        raise ConfigError(
            f"policy.clip_eps_low={cfg.policy.clip_eps_low} must be < 1 (the ratio is clipped at 1 - eps)"
        )
    if not 0.0 < cfg.sampling.temperature:
        raise ConfigError(f"sampling.temperature={cfg.sampling.temperature} must be > 0")
    if not 0.0 < cfg.sampling.top_p <= 1.0:
        raise ConfigError(f"sampling.top_p={cfg.sampling.top_p} must be in (0, 1]")
    if cfg.sampling.top_k < 0:
        raise ConfigError(f"sampling.top_k={cfg.sampling.top_k} must be >= 0 (0: off)")
    if cfg.env.max_prompt_tokens + cfg.sampling.max_new_tokens > cfg.inference_model.max_model_len:
        raise ConfigError(
            f"env.max_prompt_tokens ({cfg.env.max_prompt_tokens}) + sampling.max_new_tokens "
            f"({cfg.sampling.max_new_tokens}) exceeds inference_model.max_model_len "
            f"({cfg.inference_model.max_model_len}); raise max_model_len or lower one of the others"
        )
    _validate_policy(cfg.policy)
    _validate_overlong(cfg.policy, cfg.sampling.max_new_tokens)
    for role in ("train_model", "ref_model", "inference_model", "reward_model"):
        n = getattr(cfg, role).num_devices
        if n < 1:
            raise ConfigError(f"{role}.num_devices={n} must be >= 1")
    if cfg.seed < 0:
        raise ConfigError(f"seed={cfg.seed} must be >= 0 (it seeds numpy, which takes no negative seed)")
    for key in ("optimizer.beta1", "optimizer.beta2"):
        value = getattr(cfg.optimizer, key.split(".")[1])
        if not 0.0 <= value < 1.0:
            raise ConfigError(
                f"{key}={value} must be in [0, 1) (AdamW's moment decay; the usual values are beta1=0.9, beta2=0.99)"
            )
    _positive("optimizer.eps", cfg.optimizer.eps)
    for key in (
        "optimizer.lr",
        "optimizer.eps",
        "optimizer.weight_decay",
        "optimizer.max_grad_norm",
        "policy.kl_coef",
        "policy.clip_eps_low",
        "policy.clip_eps_high",
        "sampling.temperature",
    ):
        group, name = key.split(".")
        _finite(key, getattr(getattr(cfg, group), name))
    im = cfg.inference_model
    if not (math.isfinite(im.kv_cache_gb) and im.kv_cache_gb > 0):
        raise ConfigError(
            f"inference_model.kv_cache_gb={im.kv_cache_gb} must be > 0: it is the engine's KV cache on "
            "the CPU; about prompts x (prompt + group_size x max_new_tokens) tokens of it serve a step "
            "at once (0.5 is plenty for the defaults)"
        )
    if not 0.0 < im.gpu_memory_utilization <= 1.0:
        raise ConfigError(
            f"inference_model.gpu_memory_utilization={im.gpu_memory_utilization} must be in (0, 1] "
            "(the fraction of GPU memory for the engine's weights and KV cache)"
        )
    _validate_servers(cfg)
    _validate_tools(cfg)
    if cfg.policy.dynamic_sampling_max_rounds < 0:
        raise ConfigError(
            f"policy.dynamic_sampling_max_rounds={cfg.policy.dynamic_sampling_max_rounds} must be >= 0 "
            "(extra batches a step may draw; 0: only the first)"
        )
    _validate_rewards(cfg, rewards)
    _validate_lifecycle(cfg)
    _validate_pipeline(cfg)


def resolve_loss_type(loss_type: str, aggregation: str | None) -> tuple[str, str]:
    """The ``(objective, aggregation)`` pair that ``policy.loss_type`` and ``policy.aggregation`` name; an alias
    (``dapo``, ``bnpo``, ``dr_grpo``) is ``grpo`` with its aggregation.

    Raises:
        ConfigError: an unknown loss type or aggregation, or an aggregation that contradicts an alias.
    """
    _choice("policy.loss_type", loss_type, tuple(LOSS_TYPES))
    objective, default, fixed = LOSS_TYPES[loss_type]
    if aggregation is None:
        return objective, default
    _choice("policy.aggregation", aggregation, AGGREGATIONS)
    if fixed and aggregation != default:
        raise ConfigError(
            f"policy.loss_type={loss_type} is grpo with policy.aggregation={default}, but policy.aggregation="
            f"{aggregation}; set policy.aggregation=null, or policy.loss_type=grpo to keep aggregation={aggregation}"
        )
    return objective, aggregation


def _validate_policy(policy: Any) -> None:
    """The objective's settings: names, non-negative coefficients, ordered bounds."""
    for key in (
        "cispo_ratio_max",
        "entropy_coef",
        "advantage_eps",
        "sapo_temperature_pos",
        "sapo_temperature_neg",
        "gmpo_clip_eps",
    ):
        _finite(f"policy.{key}", getattr(policy, key))
    _positive("policy.entropy_coef", policy.entropy_coef, allow_zero=True)
    for key in ("sapo_temperature_pos", "sapo_temperature_neg", "gmpo_clip_eps"):
        _positive(f"policy.{key}", getattr(policy, key))
    if not policy.advantage_eps > 0:
        raise ConfigError(
            f"policy.advantage_eps={policy.advantage_eps} must be > 0: it keeps a group whose rewards "
            "are all equal (std 0) at advantage 0 instead of 0/0; the default is 1e-6, TRL's 1e-4"
        )
    if policy.cispo_ratio_max < 1.0:
        raise ConfigError(
            f"policy.cispo_ratio_max={policy.cispo_ratio_max} must be >= 1: the weight of an on-policy "
            "token (ratio 1) must pass; TRL's recommended value is 5.0"
        )
    if policy.cispo_ratio_min is not None and not 0.0 <= policy.cispo_ratio_min <= 1.0:
        raise ConfigError(
            f"policy.cispo_ratio_min={policy.cispo_ratio_min} must be in [0, 1] (or null for no lower bound)"
        )
    cap, low, high = policy.tis_cap, policy.engine_correction_min, policy.engine_correction_max
    if cap is not None and not cap >= 1.0:
        raise ConfigError(f"policy.tis_cap={cap} must be >= 1 (or null to disable)")
    mode = policy.engine_correction
    _choice("policy.engine_correction", mode, ENGINE_CORRECTIONS)
    band = mode.endswith("_band_mask")
    if band and (low is None or high is None):
        raise ConfigError(
            f"policy.engine_correction={mode} needs both bounds of its band: set "
            "policy.engine_correction_min and policy.engine_correction_max (IcePop's: 0.5 and 5.0)"
        )
    if high is not None:
        if not band:
            raise ConfigError(
                f"policy.engine_correction_max={high} bounds only token_band_mask and "
                f"sequence_band_mask; policy.engine_correction={mode}'s upper bound is policy.tis_cap"
            )
        if not (math.isfinite(high) and high >= 1.0):
            raise ConfigError(
                f"policy.engine_correction_max={high} must be a finite number >= 1: a weight near 1, "
                "where engine and learner agree, must pass (IcePop's is 5.0)"
            )
    upper = "policy.engine_correction_max" if band else "policy.tis_cap"
    if low is not None:
        if cap is None:
            raise ConfigError(
                f"policy.engine_correction_min={low} with policy.tis_cap=null: the engine correction is "
                "off, so the lower bound does nothing; set policy.tis_cap (e.g. 2.0) or drop the bound"
                + (" (the band modes do not use its value)" if band else "")
            )
        if not 0.0 <= low <= 1.0:  # hence <= the upper bound, which is >= 1
            raise ConfigError(
                f"policy.engine_correction_min={low} must be in [0, 1], below {upper}: a weight near "
                "1, where engine and learner agree, must pass; or null for no lower bound"
            )


def _validate_overlong(policy: Any, max_new_tokens: int) -> None:
    """DAPO's length treatments: a buffer inside the generation limit and a non-negative punishment."""
    buffer = policy.overlong_buffer
    if buffer < 0:
        raise ConfigError(
            f"policy.overlong_buffer={buffer} must be >= 0: it is the number of tokens below "
            "sampling.max_new_tokens over which the overlong punishment ramps up; 0 turns it off"
        )
    if buffer >= max_new_tokens:
        raise ConfigError(
            f"policy.overlong_buffer={buffer} must be < sampling.max_new_tokens={max_new_tokens}: "
            "otherwise every answer, however short, is punished for its length; DAPO uses a fifth of "
            f"the limit (e.g. policy.overlong_buffer={max(1, max_new_tokens // 5)})"
        )
    _finite("policy.overlong_penalty", policy.overlong_penalty)
    if policy.overlong_penalty < 0:
        raise ConfigError(
            f"policy.overlong_penalty={policy.overlong_penalty} must be >= 0: it is the size of the "
            "punishment at sampling.max_new_tokens (DAPO: 1.0); a negative one would reward length; "
            "set policy.overlong_buffer=0 to turn the punishment off"
        )


def _validate_pipeline(cfg: Any) -> None:
    """The asynchronous loop's settings."""
    p = cfg.pipeline
    _positive("pipeline.max_staleness", p.max_staleness, allow_zero=True)
    _positive("pipeline.push_every", p.push_every)
    _positive("pipeline.buffer_capacity", p.buffer_capacity)
    _positive("pipeline.poll_seconds", p.poll_seconds)
    _positive("pipeline.max_restarts", p.max_restarts, allow_zero=True)
    _positive("train.max_restarts", cfg.train.max_restarts, allow_zero=True)
    _choice("pipeline.weight_transport", p.weight_transport, ("auto", "object_store", "collective"))
    sim = cfg.simulate
    for key in ("generation_seconds", "reference_seconds", "training_seconds", "jitter"):
        _positive(f"simulate.{key}", getattr(sim, key), allow_zero=True)
    _positive("simulate.answer_tokens", sim.answer_tokens)
    if sim.max_num_seqs is not None:
        _positive("simulate.max_num_seqs", sim.max_num_seqs)
    if p.groups_in_flight is not None:
        _positive("pipeline.groups_in_flight", p.groups_in_flight)
        if p.whole_batches and p.groups_in_flight != cfg.env.prompts_per_step:
            raise ConfigError(
                f"pipeline.groups_in_flight={p.groups_in_flight} with pipeline.whole_batches=true: a whole batch is "
                f"env.prompts_per_step={cfg.env.prompts_per_step} groups; set groups_in_flight=null or "
                "whole_batches=false"
            )
    _positive("pipeline.timeout_seconds", p.timeout_seconds)
    _positive("pipeline.start_timeout_seconds", p.start_timeout_seconds)
    if p.max_staleness < p.push_every - 1:
        raise ConfigError(
            f"pipeline.max_staleness={p.max_staleness} < pipeline.push_every - 1 = {p.push_every - 1}: the engine "
            f"keeps a policy version for push_every steps, so nearly every sample would be dropped; raise "
            f"max_staleness or lower push_every"
        )


def is_loopback(url: str) -> bool:
    """``url`` names a Unix socket or a loopback address (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    return url.startswith("unix:") or is_loopback_host(urlsplit(url).hostname or "")


def is_loopback_host(host: str) -> bool:
    """``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate_servers(cfg: Any) -> None:
    """``inference_model.urls`` and the served engine's settings."""
    im = cfg.inference_model
    _choice("inference_model.weight_transfer", im.weight_transfer, ("auto", "file", "nccl"))
    _positive("inference_model.request_timeout_s", im.request_timeout_s)
    _positive("inference_model.server_start_timeout_s", im.server_start_timeout_s)
    if im.urls:
        if im.engine != "vllm_server":
            raise ConfigError(
                f"inference_model.urls={list(im.urls)} names servers, but inference_model.engine="
                f"{im.engine}; set inference_model.engine=vllm_server"
            )
        bad = [u for u in im.urls if not str(u).startswith(("http://", "https://", "unix:/"))]
        if bad:
            raise ConfigError(
                f"inference_model.urls: {bad[0]!r} is not a server address; write it as "
                "https://HOST:PORT, http://127.0.0.1:PORT or unix:/PATH"
            )
        cleartext = [u for u in im.urls if str(u).startswith("http://") and not is_loopback(str(u))]
        if cleartext and not im.allow_unencrypted_network:
            raise ConfigError(
                f"inference_model.urls: {cleartext[0]} is another machine over plain http, which "
                "would send the key and the weights in cleartext: serve it with TLS and write "
                "https:// (docs/pipeline.md, 'Security'), reach it through an SSH tunnel on "
                "http://127.0.0.1, or set inference_model.allow_unencrypted_network=true on a network "
                "you trust"
            )
    if bool(im.ssl_certfile) != bool(im.ssl_keyfile):
        raise ConfigError(
            "inference_model.ssl_certfile and inference_model.ssl_keyfile go together: give both, or neither"
        )
    if not is_loopback_host(im.server_host) and not im.ssl_certfile and not im.allow_unencrypted_network:
        raise ConfigError(
            f"inference_model.server_host={im.server_host}: the run's servers would take the key and "
            "the weights in cleartext on the network; give inference_model.ssl_certfile and "
            "ssl_keyfile, keep server_host=127.0.0.1, or set "
            "inference_model.allow_unencrypted_network=true on a network you trust"
        )
    if cfg.pipeline.inflight_updates and im.engine != "vllm_server" and not cfg.simulate.enabled:
        raise ConfigError(
            "pipeline.inflight_updates=true updates weights under answers in flight, which needs "
            "vLLM servers: set inference_model.engine=vllm_server"
        )


def validate_async(cfg: Any) -> None:
    """What only the asynchronous loop needs on top of :func:`validate` (the synchronous one ignores ``pipeline``)."""
    p, updates = cfg.pipeline, cfg.train.updates_per_batch
    if cfg.inference_model.share_weights:
        raise ConfigError(
            "inference_model.share_weights=true: the asynchronous loop's engines run in collector "
            "actors while the learner trains, so they cannot generate with its model; run sota/grpo.py, "
            "or set inference_model.share_weights=false"
        )
    if updates > 1 and p.max_staleness < updates:
        raise ConfigError(
            f"pipeline.max_staleness={p.max_staleness} < train.updates_per_batch={updates}: every step advances the "
            f"policy version by train.updates_per_batch, so a batch that waited one step in the buffer is already "
            f"{updates} versions old and nearly every sample would be dropped; raise max_staleness to at least "
            f"{updates}"
        )


def _validate_train_length(train: Any) -> None:
    """``train.updates_per_batch`` (taking the deprecated ``train.epochs``) and ``train.prompt_epochs``."""
    old = train.epochs
    if old is not None:
        _positive("train.epochs", old)
        if train.updates_per_batch not in (1, old):
            raise ConfigError(
                f"train.epochs={old} and train.updates_per_batch={train.updates_per_batch}: "
                "train.epochs is the deprecated name of train.updates_per_batch; drop train.epochs"
            )
        log.warning(
            "train.epochs is deprecated: it counts optimizer steps per batch, now train.updates_per_batch=%d "
            "(passes over the prompt set are train.prompt_epochs)",
            old,
        )
        # one key for the rest of the code, the saved config and a resumed run
        train.updates_per_batch, train.epochs = old, None
    _positive("train.updates_per_batch", train.updates_per_batch)
    epochs = train.prompt_epochs
    if epochs is not None and not (math.isfinite(epochs) and epochs > 0):
        raise ConfigError(
            f"train.prompt_epochs={epochs:g} must be > 0 (passes over the training prompts, fractions "
            "allowed), or null to run train.steps steps"
        )


def _validate_arithmetic(cfg: Any) -> None:
    """``env.arithmetic``: known operations, digit counts and sizes; with env.dataset=arithmetic, splits that exist
    and sizes the operations can fill with distinct problems."""
    a = cfg.env.arithmetic
    ops = list(a.operations)
    if not ops:
        raise ConfigError("env.arithmetic.operations is empty; list one or more of add, sub, mul")
    for op in ops:
        _choice("env.arithmetic.operations", op, ("add", "sub", "mul"))
    if len(set(ops)) != len(ops):
        raise ConfigError(f"env.arithmetic.operations={ops} repeats an operation; list each once")
    for key in ("digits", "mul_digits"):
        if not 1 <= getattr(a, key) <= 9:
            raise ConfigError(f"env.arithmetic.{key}={getattr(a, key)} must be in [1, 9]")
    _positive("env.arithmetic.train_size", a.train_size)
    _positive("env.arithmetic.test_size", a.test_size)
    if cfg.env.dataset != "arithmetic":
        return
    for key, split in (("env.split", cfg.env.split), ("eval.split", cfg.eval.split)):
        if split is not None:
            _choice(key, split, ("train", "test"))


def _validate_hub_dataset(env: Any) -> None:
    """``env.hub_dataset`` and ``env.hub_config``: a hub data set in place of ``env.path``, for env.dataset=file."""
    name, config = env.hub_dataset, env.hub_config
    if name is None:
        if config is not None:
            raise ConfigError(
                f"env.hub_config={config} names a configuration of env.hub_dataset, which is not set; "
                "set env.hub_dataset=<org/name> or env.hub_config=null"
            )
        return
    if not str(name).strip():
        raise ConfigError("env.hub_dataset is empty; set it to a data set name such as org/name, or null")
    if env.dataset != "file":
        raise ConfigError(
            f"env.hub_dataset={name} is read with env.dataset=file (gsm8k and ifeval load their own "
            f"data), but env.dataset={env.dataset}; set env.dataset=file, or env.hub_dataset=null"
        )
    if env.path:
        raise ConfigError(
            f"env.hub_dataset={name} and env.path={env.path} both name the prompts; keep one "
            "(env.path=null to read the hub data set)"
        )


def _validate_env_path(path: Any) -> None:
    """``env.path``: null, a path, or a non-empty list of paths."""
    if path is None or isinstance(path, str):
        return
    if not isinstance(path, Sequence):  # a number, a mapping; an OmegaConf ListConfig is a Sequence
        raise ConfigError(
            f"env.path={path!r} must be a file or folder path, or a list of files such as env.path=[a.jsonl,b.jsonl]"
        )
    paths = list(path)
    if not paths:
        raise ConfigError(
            "env.path=[] names no file; set env.path to a file, or a list of files such as env.path=[a.jsonl,b.jsonl]"
        )
    bad = [p for p in paths if not isinstance(p, str) or not p]
    if bad:
        raise ConfigError(f"env.path={paths}: {bad[0]!r} is not a file path; list file paths only")


def _loads_adapters(cfg: Any) -> bool:
    return cfg.inference_model.engine in ("vllm", "vllm_server") and not cfg.simulate.enabled


def lora_push(cfg: Any, engine_on_gpu: bool) -> str:
    """``model.lora.push`` resolved for engines on a GPU or the CPU: ``adapter`` where the engine loads adapters
    itself (vLLM, in a process of the run or a server the run starts) on a GPU, ``merged`` otherwise (servers the
    user gave, ``inference_model.urls``, take adapters only when asked: they must run with ``--enable-lora``). On the
    CPU vLLM applies an adapter with plain torch ops in every decoding step: with SmolLM2-135M, r=16, on a 2-core AMD
    EPYC with AVX2, an adapter push took 0.20 s against 1.53 s merged, but generation 4.1x as long
    (benchmarks/micro/lora_push.py), so the CPU's default is merged (a push saves about a second where every
    decoding step pays)."""
    push = cfg.model.lora.push
    if push == "auto":
        given = bool(cfg.inference_model.urls)
        return "adapter" if _loads_adapters(cfg) and engine_on_gpu and not given else "merged"
    return push


def pushes_adapter(cfg: Any) -> bool:
    """Whether the run's weight pushes carry the LoRA adapter alone (``model.lora.push`` as ``make_run`` resolved
    it): the learner sends what the engines are started to take."""
    return bool(cfg.model.lora.enabled) and cfg.model.lora.push == "adapter"


def _validate_lifecycle(cfg: Any) -> None:
    """LoRA, evaluation and logging settings."""
    lora = cfg.model.lora
    if lora.enabled:
        _positive("model.lora.r", lora.r)
        _positive("model.lora.alpha", lora.alpha)
        if not 0.0 <= lora.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={lora.dropout} must be in [0, 1)")
        if not lora.target_modules:
            raise ConfigError("model.lora.target_modules is empty; name modules (q_proj, v_proj, ...) or [all-linear]")
        _choice("model.lora.push", lora.push, ("auto", "adapter", "merged"))
        if lora.push == "adapter" and not _loads_adapters(cfg):
            raise ConfigError(
                f"model.lora.push=adapter with inference_model.engine={cfg.inference_model.engine}"
                f"{' and simulate.enabled=true' if cfg.simulate.enabled else ''}: only a vLLM engine in the "
                "learner's process, a collector or a server loads adapters; set model.lora.push=auto (merged weights)"
            )
    ev = cfg.eval
    _positive("eval.every", ev.every, allow_zero=True)
    _positive("eval.num_prompts", ev.num_prompts)
    _positive("eval.pass_k", ev.pass_k, allow_zero=True)
    _positive("eval.temperature", ev.temperature)
    if ev.num_samples is not None and ev.num_samples < ev.pass_k:
        raise ConfigError(f"eval.num_samples={ev.num_samples} must be >= eval.pass_k={ev.pass_k}")
    if ev.max_new_tokens is not None:
        _positive("eval.max_new_tokens", ev.max_new_tokens)
    _positive("logger.examine_every", cfg.logger.examine_every)
    _positive("logger.num_examine", cfg.logger.num_examine, allow_zero=True)
    _positive("train.keep_checkpoints", cfg.train.keep_checkpoints)
    limit = cfg.train.max_time_minutes
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise ConfigError(f"train.max_time_minutes={limit} must be > 0, or null for no time limit")


def _validate_tools(cfg: Any) -> None:
    """Multi-turn settings (the tool files themselves are loaded by the preflight)."""
    env = cfg.env
    if env.max_turns < 1:
        raise ConfigError(f"env.max_turns={env.max_turns} must be >= 1 (1: one answer per prompt, no tools)")
    _positive("env.tool_reply_chars", env.tool_reply_chars)
    if env.tools and env.max_turns < 2:
        raise ConfigError(
            f"env.tools has {len(env.tools)} tool(s) but env.max_turns={env.max_turns}: a tool's "
            "result needs a turn after the call; set env.max_turns to 2 or more (e.g. 4)"
        )
    if env.max_turns > 1 and not env.tools:
        raise ConfigError(
            f"env.max_turns={env.max_turns} without env.tools: a turn ends only at a tool call, so "
            "there would be nothing to continue; add env.tools=[{name: calculator}] or set "
            "env.max_turns=1"
        )


def _validate_rewards(cfg: Any, rewards: Sequence[Any] = ()) -> None:
    """Task reward settings (the reward files themselves are loaded by the preflight)."""
    weights = dict(cfg.reward.ifeval_weights)
    unknown = sorted(set(weights) - set(IFEVAL_COMPONENTS))
    if unknown:
        raise ConfigError(f"reward.ifeval_weights has unknown key(s) {unknown}; valid: {', '.join(IFEVAL_COMPONENTS)}")
    for key, w in weights.items():
        _finite(f"reward.ifeval_weights.{key}", w)
        _positive(f"reward.ifeval_weights.{key}", w, allow_zero=True)
    for key in ("correctness_weight", "format_weight", "model_weight", "thinking_weight", "scale", "bias"):
        _finite(f"reward.{key}", getattr(cfg.reward, key))
    _positive("reward.correctness_weight", cfg.reward.correctness_weight, allow_zero=True)
    _positive("reward.format_weight", cfg.reward.format_weight, allow_zero=True)
    _positive("reward.thinking_weight", cfg.reward.thinking_weight, allow_zero=True)
    _positive("reward.min_thinking_tokens", cfg.reward.min_thinking_tokens, allow_zero=True)
    if cfg.reward.scale <= 0:
        raise ConfigError(
            f"reward.scale={cfg.reward.scale:g} must be > 0: 0 makes every advantage 0 and a negative "
            "scale trains towards lower rewards; 1 leaves the reward as it is"
        )
    if cfg.reward.thinking_weight and (cfg.env.dataset not in ("gsm8k", "arithmetic") or cfg.env.template != "tags"):
        raise ConfigError(
            f"reward.thinking_weight={cfg.reward.thinking_weight:g} scores the <think> section that "
            f"env.template=tags asks for on gsm8k or arithmetic (here env.dataset={cfg.env.dataset}, "
            f"env.template={cfg.env.template}); set env.template=tags on one of those tasks, or "
            "reward.thinking_weight=0"
        )
    if cfg.env.dataset == "ifeval" and not any(weights.values()):
        raise ConfigError(
            "every reward.ifeval_weights entry is 0; give one a weight, e.g. reward.ifeval_weights.inst_strict=1"
        )
    timeout = cfg.reward.timeout_seconds
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(
            f"reward.timeout_seconds={timeout} must be > 0 (seconds one reward call may take), or null for no limit"
        )
    if not math.isfinite(cfg.reward.fallback):
        raise ConfigError(f"reward.fallback={cfg.reward.fallback} must be a finite number")
    if bool(cfg.reward.path) != bool(cfg.reward.name):
        raise ConfigError(
            f"reward.path={cfg.reward.path!r} and reward.name={cfg.reward.name!r}: set both "
            "(the Python file and the function in it) or neither"
        )
    for i, fn in enumerate(cfg.reward.functions):
        if not fn.path or not fn.name:
            raise ConfigError(
                f"reward.functions[{i}] needs both path and name, e.g. "
                "reward.functions=[{path: /abs/rewards.py, name: my_reward, weight: 1.0}]"
            )
        if not math.isfinite(fn.weight):
            raise ConfigError(f"reward.functions[{i}].weight={fn.weight} must be a finite number")
    if cfg.env.dataset == "file" and not (cfg.reward.path or cfg.reward.functions or cfg.reward.model_path or rewards):
        raise ConfigError(
            "env.dataset=file needs a reward: set reward.path=/path/to/rewards.py reward.name=<function> "
            "(see docs/custom_tasks.md), reward.functions=[...], or reward.model_path=<reward model folder>"
        )
    rm = cfg.reward_model
    _choice("reward_model.dtype", rm.dtype, ("float32", "bfloat16"))
    _positive("reward_model.batch_size", rm.batch_size)
    _positive("reward_model.max_length", rm.max_length)
    if cfg.reward.model_path:
        if rm.num_devices != 1 or (rm.devices and len(rm.devices) != 1):
            raise ConfigError(
                f"reward_model.num_devices={rm.num_devices} (devices={rm.devices}): a reward model runs "
                "on one device; set reward_model.num_devices=1 (or one index in reward_model.devices)"
            )
