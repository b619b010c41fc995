"""The rollout engine of this process, from ``inference_model`` and the run's placement: vLLM, Hugging Face
generate (``transformers``), or the scale simulation's timed stand-in."""

from __future__ import annotations

import logging
import os

import torch

from grpo_rl.config.checks import pushes_adapter
from grpo_rl.engines.server import ServerFleet, ServerSpec, engine_args
from grpo_rl.engines.server_client import model_identity
from grpo_rl.engines.vllm_engine import AdapterSlots
from grpo_rl.engines.vllm_plugin import KEY_ENV
from grpo_rl.placement.context import RunContext

log = logging.getLogger(__name__)


def make_engine(run: RunContext, policy: torch.nn.Module | None = None, fleet: ServerFleet | None = None):
    """The rollout engine on ``run.devices.inference[0]``. ``policy``: the learner's model, which a
    ``transformers`` engine generates with under ``inference_model.share_weights`` (no copy of its own);
    ``fleet``: the servers the run started, which a served engine drives."""
    cfg = run.cfg.inference_model
    device = run.devices.inference[0]
    sim = run.cfg.simulate
    if sim.enabled:
        from grpo_rl.engines.simulated import SimulatedEngine

        return SimulatedEngine(
            vocab_size=len(run.tokenizer),
            seconds=sim.generation_seconds,
            jitter=sim.jitter,
            answer_tokens=sim.answer_tokens,
            pad_id=run.tokenizer.pad_token_id or 0,
            long_tail=sim.long_tail,
            max_num_seqs=sim.max_num_seqs or run.cfg.env.prompts_per_step * run.cfg.env.group_size,
        )
    if run.placement is not None and run.placement.served:
        return make_served_engine(run, fleet.urls if fleet is not None else None)
    kwargs = dict(dtype=run.precision.inference.dtype)
    if cfg.engine == "vllm":
        from grpo_rl.engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            run.model_path,
            device,
            max_model_len=cfg.max_model_len,
            seed=run.cfg.seed,
            kv_cache_gb=cfg.kv_cache_gb,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
            enable_prefix_caching=cfg.enable_prefix_caching,
            adapters=adapter_slots(run),
            **kwargs,
        )
    from grpo_rl.engines.transformers_engine import TransformersEngine

    if cfg.share_weights and policy is not None:
        return TransformersEngine.sharing(policy, run.tokenizer, device, **kwargs)
    return TransformersEngine(run.model_path, device, compile=cfg.compile, tokenizer=run.tokenizer, **kwargs)


def adapter_slots(run: RunContext) -> AdapterSlots | None:
    """What a vLLM engine that loads the pushed LoRA adapters is started with (None: pushes carry whole weights)."""
    if not pushes_adapter(run.cfg):
        return None
    lora = run.cfg.model.lora
    # versions in use at once: one, or as many as the staleness bound lets be in flight
    slots = run.cfg.pipeline.max_staleness + 1 if run.mode == "async" else 1
    return AdapterSlots(lora.alpha, lora.r, slots)


def weight_transfer(run: RunContext) -> str:
    """``inference_model.weight_transfer`` resolved: NCCL from the learner's process (the synchronous loop) where
    the learner and its one server have GPUs of their own; else the file transport (the asynchronous loop's
    collectors relay weights they received through Ray's object store, on the CPU)."""
    cfg = run.cfg.inference_model
    if cfg.weight_transfer != "auto":
        return cfg.weight_transfer
    gpus = run.devices.inference[0].type == "cuda" and run.devices.train[0].type == "cuda"
    one_server = len(cfg.urls or run.devices.inference) == 1  # an NCCL group joins the learner and one server
    return "nccl" if gpus and one_server and run.mode == "sync" and not run.devices.engine_shares_a_gpu else "file"


def make_served_engine(run: RunContext, urls: tuple[str, ...] | None = None):
    """A :class:`~grpo_rl.engines.served.ServedEngine` over ``urls`` (the servers the run started), else
    ``run.engine_urls`` (this collector's one, or the user's); the key comes from ``GRPO_RL_ENGINE_KEY``."""
    from grpo_rl.engines.served import ServedEngine

    cfg = run.cfg.inference_model
    urls = list(urls or run.engine_urls or cfg.urls or ())
    return ServedEngine(
        urls,
        key=os.environ.get(KEY_ENV),
        pad_id=run.tokenizer.pad_token_id or 0,
        dtype=run.precision.inference.dtype,
        timeout=cfg.request_timeout_s,
        inflight=run.mode == "async" and run.cfg.pipeline.inflight_updates,
        transport=weight_transfer(run),
        weight_dir=cfg.weight_dir,
        ca_certs=cfg.ssl_ca_certs,
        model=model_identity(run.model_path),
        adapters=adapter_slots(run),
    )


def start_servers(run: RunContext) -> ServerFleet | None:
    """Start one vLLM server per inference device when the engines are served and no ``urls`` were given; the
    run's key goes into ``GRPO_RL_ENGINE_KEY`` (this process and the actors it starts); the fleet holds the servers'
    addresses. None when there is nothing to start."""
    cfg = run.cfg.inference_model
    if cfg.urls:  # the user's servers (run.engine_urls)
        return None
    if run.placement is None or not run.placement.served:
        return None
    devices = run.devices.inference
    threads = run.placement.collector.threads
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    own_cores = len(devices) > 1 and devices[0].type == "cpu" and len(cores) >= len(devices) * threads
    args = engine_args(
        dtype=run.precision.inference.dtype,
        max_model_len=cfg.max_model_len,
        seed=run.cfg.seed,
        kv_cache_gb=cfg.kv_cache_gb,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enforce_eager=cfg.enforce_eager,
        enable_prefix_caching=cfg.enable_prefix_caching,
        on_cpu=devices[0].type == "cpu",
        adapters=adapter_slots(run),
    )
    if weight_transfer(run) == "nccl":
        args += ("--weight-transfer-config", '{"backend": "nccl"}')
    specs = [
        ServerSpec(
            run.model_path,
            device,
            threads=threads,
            cores=tuple(cores[i * threads : (i + 1) * threads]) if own_cores else (),
            vllm_args=args,
        )
        for i, device in enumerate(devices)
    ]
    tls = (cfg.ssl_certfile, cfg.ssl_keyfile) if cfg.ssl_certfile else None
    fleet = ServerFleet(
        specs,
        run.run_dir,
        host=cfg.server_host,
        start_timeout=cfg.server_start_timeout_s,
        tls=tls,
        ca_certs=cfg.ssl_ca_certs,
    )
    os.environ[KEY_ENV] = fleet.key
    log.info("engine servers:\n%s", fleet.describe())
    return fleet
