"""Ray start-up and per-role resource requests, derived once from the device allocation.

* ``ray.address=null`` starts a local instance (stopped again by :func:`stop_ray`); ``ray.address=auto`` or
  ``ray://host:port`` joins a running cluster, which is left running.
* Each actor asks Ray for what its role was allocated in :mod:`grpo_rl.devices`: one GPU per engine replica
  or learner rank on a GPU machine (Ray then sets ``CUDA_VISIBLE_DEVICES``, so the actor sees ``cuda:0``),
  CPU cores on a machine without GPUs.
* Threads (machine facts in DESIGN.md): when roles run at the same time, more torch threads than cores in
  total slows every matmul 10-30x. :func:`cpu_threads_per_worker` splits the cores among the roles that
  are busy at once, and each actor gets ``OMP_NUM_THREADS`` in its ``runtime_env``, set before torch or vLLM
  is imported there.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)

# Forwarded to every actor, so that actors on other nodes see the same offline/data/cache settings.
_FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "GRPO_DATA_DIR", "GRPO_CACHE_DIR",
                  "TORCHINDUCTOR_CACHE_DIR", "VLLM_CPU_KVCACHE_SPACE", "WANDB_MODE", "PYTHONPATH")


def start_ray(ray_cfg, *, min_cpus: int = 0, actor_gpus: list[torch.device] = ()) -> bool:
    """Start or join Ray as ``ray_cfg`` says; return True if this call started a local instance.

    Args:
        ray_cfg: the ``ray`` config group.
        min_cpus: logical CPUs the run's actors ask for in total; a local instance gets at least that many
            (oversubscription is then visible in the thread counts, not as an actor that never starts).
        actor_gpus: the GPUs allocated to roles that run as actors. A local instance is given exactly these
            (``CUDA_VISIBLE_DEVICES`` while it starts), so Ray never places an actor on a GPU of a role that runs
            in the driver, such as the learner. A joined cluster places actors on GPUs itself: start its node on
            the driver's machine without the learner's GPUs (``ray start --num-gpus``).
    """
    import ray

    if ray.is_initialized():
        return False
    common = dict(include_dashboard=ray_cfg.include_dashboard, log_to_driver=True,
                  configure_logging=False)
    if ray_cfg.address:
        ray.init(address=ray_cfg.address, **common)
        log.info("joined Ray cluster at %s: %s", ray_cfg.address, ray.cluster_resources())
        return False
    num_cpus = max(ray_cfg.num_cpus or os.cpu_count() or 1, min_cpus)
    gpu_ids = sorted({d.index for d in actor_gpus if d.type == "cuda"})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu_ids:  # the Ray processes started now inherit it; this process keeps its own view
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    try:
        ray.init(num_cpus=num_cpus, num_gpus=len(gpu_ids), **common)
    finally:
        if gpu_ids:
            if visible is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible
    log.info("started a local Ray instance: %d CPUs, GPUs %s for actors", num_cpus, gpu_ids or "none")
    return True


def stop_ray(started: bool) -> None:
    """Shut Ray down if :func:`start_ray` started it (a joined cluster keeps running)."""
    import ray

    if started and ray.is_initialized():
        ray.shutdown()


def cpu_threads_per_worker(num_busy_workers: int, num_cpus: int | None = None) -> int:
    """Torch threads per worker when ``num_busy_workers`` processes compute at the same time."""
    num_cpus = num_cpus or os.cpu_count() or 1
    return max(1, num_cpus // max(1, num_busy_workers))


def actor_options(device: torch.device, threads: int, **extra: Any) -> dict[str, Any]:
    """``ray.remote(...).options(...)`` for an actor of a role placed on ``device`` with ``threads`` threads."""
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", RAY_DEDUP_LOGS="0")
    resources: dict[str, Any] = {"num_cpus": threads}
    if device.type == "cuda":
        resources = {"num_cpus": 1, "num_gpus": 1}
    return {**resources, "runtime_env": {"env_vars": env}, **extra}


def worker_device(device: torch.device) -> torch.device:
    """The device as an actor sees it: Ray exposes one GPU per actor, always as ``cuda:0``."""
    return torch.device("cuda", 0) if device.type == "cuda" else device


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
