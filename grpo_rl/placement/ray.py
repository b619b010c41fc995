"""Ray start-up, once per run, sized from the run's placement (:mod:`grpo_rl.placement.context`).

``ray.address=null`` starts a local instance (stopped again by :func:`stop_ray`); ``ray.address=auto`` or
``ray://host:port`` joins a running cluster, which is left running. What each actor asks for (GPUs, CPUs,
``OMP_NUM_THREADS``) is its role's :meth:`~grpo_rl.placement.context.RolePlacement.ray_options`.
"""
from __future__ import annotations

import logging
import os

import torch

from grpo_rl.placement.devices import available_cpus

log = logging.getLogger(__name__)


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
    num_cpus = max(ray_cfg.num_cpus or available_cpus(), min_cpus)
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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
