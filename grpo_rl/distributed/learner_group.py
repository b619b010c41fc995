"""A data-parallel learner: ``train_model.num_devices`` ranks as Ray actors in one torch.distributed group.

:class:`LearnerGroup` has the :class:`~grpo_rl.learner.Learner` interface the loops and the run lifecycle use
(``train_step``, ``named_weights``, ``version``, ``state_dict``/``load_state_dict``, ``model``), so both
scripts take it from :func:`grpo_rl.factories.make_learner` unchanged. Each rank holds a full replica on its
device (gloo on the CPU, NCCL on GPUs) and trains on a shard of every batch; gradients are summed over ranks
(:mod:`grpo_rl.distributed.data_parallel`), so the replicas stay identical.

``model`` is a CPU copy of rank 0's weights in the driver: refreshed by :meth:`LearnerGroup.state_dict`
(every checkpoint calls it before writing ``model``), and sent to every rank by
:meth:`LearnerGroup.load_state_dict` (resume loads the checkpoint's weights into it first).
"""
from __future__ import annotations

import logging

import torch
from omegaconf import OmegaConf

from grpo_rl.distributed.actors import actor_run_context
from grpo_rl.distributed.data_parallel import GradientAllReduce, shard_batch
from grpo_rl.distributed.ray_setup import actor_options, cpu_threads_per_worker, free_port, start_ray, stop_ray, worker_device

log = logging.getLogger(__name__)


class LearnerRank:
    """One rank: a :class:`~grpo_rl.learner.Learner` on its device, joined to the group's process group."""

    def __init__(self, cfg_container: dict, run_dir: str, model_path: str, device: torch.device, *, rank: int,
                 world_size: int, master_address: str, master_port: int, threads: int):
        import torch.distributed as dist

        from grpo_rl.factories import make_learner, seed_everything
        from grpo_rl.quiet import quiet_start

        quiet_start()
        torch.set_num_threads(threads)
        run = actor_run_context(cfg_container, run_dir, model_path, device)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL binds each rank to "its" GPU (the only one Ray exposes)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                                init_method=f"tcp://{master_address}:{master_port}")
        seed_everything(run.cfg.seed)  # identical initialisation on every rank (LoRA adapters are random)
        self.learner = make_learner(run)
        self.learner.data_parallel = GradientAllReduce()

    def ready(self) -> bool:
        return True

    def train_step(self, shard) -> dict:
        return {**self.learner.train_step(shard), "version": self.learner.version,
                "skipped_steps": self.learner.skipped_steps}

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return [(k, v.detach().to("cpu").clone()) for k, v in self.learner.named_weights()]

    def weight_packet(self):
        from grpo_rl.weight_sync import pack_weights

        return pack_weights(self.learner.named_weights(), self.learner.version)

    def model_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu") for k, v in self.learner.model.state_dict().items()}

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load(self, model_state: dict, learner_state: dict) -> None:
        self.learner.model.load_state_dict(model_state)
        self.learner.load_state_dict(learner_state)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class LearnerGroup:
    """``len(run.devices.train)`` learner ranks behind the ``Learner`` interface (see the module docstring).

    Args:
        run: the run context.
        threads: torch threads per rank (default: the cores split between the ranks).
    """

    def __init__(self, run, threads: int | None = None):
        import ray

        from grpo_rl.models import load_causal_lm

        if run.cfg.model.lora.enabled:
            raise NotImplementedError("model.lora.enabled=true with train_model.num_devices > 1 is not supported; "
                                      "use one training device for LoRA")
        world = len(run.devices.train)
        threads = threads or cpu_threads_per_worker(world)
        self._started_ray = start_ray(run.cfg.ray, min_cpus=world * threads, actor_gpus=run.devices.train)
        address, port = ray.util.get_node_ip_address(), free_port()
        container = OmegaConf.to_container(run.cfg, resolve=True)
        self.ranks = [
            ray.remote(LearnerRank).options(**actor_options(dev, threads)).remote(
                container, str(run.run_dir), run.model_path, worker_device(dev), rank=i, world_size=world,
                master_address=address, master_port=port, threads=threads)
            for i, dev in enumerate(run.devices.train)
        ]
        ray.get([r.ready.remote() for r in self.ranks])
        log.info("data-parallel learner: %d ranks (%s), %d threads each", world, run.devices.describe(), threads)
        self.device = torch.device("cpu")
        self.model = load_causal_lm(run.model_path, self.device, run.cfg.model.dtype, trainable=False)
        self.version = 0
        self.skipped_steps = 0

    def train_step(self, batch) -> dict[str, float]:
        """``train.epochs`` optimizer steps on ``batch`` (see :meth:`Learner.train_step`), split over the ranks by
        whole groups."""
        import ray

        shards = shard_batch(batch, len(self.ranks))
        results = ray.get([r.train_step.remote(s) for r, s in zip(self.ranks, shards)])
        metrics = dict(results[0])  # diagnostics were summed over ranks inside the step
        self.version, self.skipped_steps = metrics.pop("version"), metrics.pop("skipped_steps")
        metrics["num_micro_batches"] = float(sum(r["num_micro_batches"] for r in results))
        return metrics

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        import ray

        return ray.get(self.ranks[0].named_weights.remote())

    def weight_packet(self):
        """Rank 0's weights in the Ray object store (see :mod:`grpo_rl.weight_sync`)."""
        import ray

        return ray.get(self.ranks[0].weight_packet.remote())

    def state_dict(self) -> dict:
        import ray

        self.model.load_state_dict(ray.get(self.ranks[0].model_state.remote()))
        return ray.get(self.ranks[0].state_dict.remote())

    def load_state_dict(self, state: dict) -> None:
        import ray

        model_state = {k: v.detach() for k, v in self.model.state_dict().items()}
        ray.get([r.load.remote(model_state, state) for r in self.ranks])
        self.version, self.skipped_steps = state["version"], state["skipped_steps"]

    def shutdown(self) -> None:
        import ray

        for r in self.ranks:
            try:
                ray.get(r.shutdown.remote(), timeout=30)
                ray.kill(r)
            except Exception as e:  # already gone
                log.debug("learner rank shutdown: %s", e)
        stop_ray(self._started_ray)
