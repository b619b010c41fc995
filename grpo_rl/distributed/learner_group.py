"""A data-parallel learner: ``train_model.num_devices`` ranks as Ray actors in one torch.distributed group.

:class:`LearnerGroup` has the :class:`~grpo_rl.training.learner.Learner` interface the loops and the run lifecycle use
(``train_step``, ``named_weights``, ``version``, ``state_dict``/``load_state_dict``, ``model``), so both
scripts take it from :func:`grpo_rl.run.roles.make_learner` unchanged. Each rank trains on a shard of every batch
(gloo on the CPU, NCCL on GPUs). With ``train_model.sharding=none`` each rank holds a full replica and gradients
are summed over ranks (:mod:`grpo_rl.distributed.data_parallel`), so the replicas stay identical; with ``fsdp``
parameters, gradients and optimizer state are sharded (:mod:`grpo_rl.distributed.sharding`) and the weights are
gathered once per push or checkpoint.

The ranks meet at a ``TCPStore`` the driver hosts on the node address Ray gave it (loopback on one machine;
:mod:`grpo_rl.placement.ray`), and gloo and NCCL connect over the interface each rank reaches it by.

``model`` is a CPU copy of rank 0's weights in the driver: refreshed by :meth:`LearnerGroup.state_dict`
(every checkpoint calls it before writing ``model``), and sent to every rank by
:meth:`LearnerGroup.load_state_dict` (resume loads the checkpoint's weights into it first).
"""

from __future__ import annotations

import logging
import os
import time

from grpo_rl.quiet import quiet_logging, quiet_start

# A learner rank's process imports this module first: drop the known notices of the imports below before they print.
quiet_logging()

import torch

from grpo_rl import trace
from grpo_rl.distributed.data_parallel import GradientAllReduce, shard_batch
from grpo_rl.distributed.healing import died_how, record_pids
from grpo_rl.distributed.reference_actors import wait_ready
from grpo_rl.errors import LearnerLost, RoleFailed
from grpo_rl.placement.context import ActorSpec, RunContext
from grpo_rl.placement.ray import address_towards, host_store, interface_with_address, node_address
from grpo_rl.training.build import make_local_learner, seed_everything
from grpo_rl.weights.sync import WeightPacket, call_error, pack_weights

log = logging.getLogger(__name__)


class LearnerRank:
    """One rank: a :class:`~grpo_rl.training.learner.Learner` on its device, joined to the group's process group,
    which meets at the driver's store ``master_address:master_port``."""

    def __init__(self, spec: ActorSpec, *, world_size: int, master_address: str, master_port: int, timeout: float):
        import datetime

        import torch.distributed as dist

        quiet_start()
        run = spec.enter()
        device, rank = spec.device, spec.index
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL binds each rank to "its" GPU (the only one Ray exposes)
        # gloo's default group and NCCL listen on the interface named here, else on whatever the host name resolves
        # to (gloo) or the first non-loopback interface (NCCL); the environment is this rank's process's own
        interface = interface_with_address(address_towards(master_address))
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = interface
        limit = datetime.timedelta(seconds=timeout)
        store = dist.TCPStore(master_address, master_port, None, False, limit)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=world_size, timeout=limit
        )
        seed_everything(run.cfg.seed)  # identical initialisation on every rank (LoRA adapters are random)
        self.sharded = run.cfg.train_model.sharding == "fsdp"
        if self.sharded:
            from grpo_rl.distributed.sharding import ShardedDataParallel, shard_model

            self.learner = make_local_learner(run, shard=shard_model)
            self.learner.data_parallel = ShardedDataParallel()
        else:
            self.learner = make_local_learner(run)
            self.learner.data_parallel = GradientAllReduce()

    def ready(self) -> int:
        return os.getpid()

    def train_step(self, shard) -> dict:
        with trace.span("train", rows=shard.batch_size[0]):
            metrics = self.learner.train_step(shard)
        trace.flush()  # a rank may be killed without notice: each step's span is on disk
        return {**metrics, "version": self.learner.version, "skipped_steps": self.learner.skipped_steps}

    def _full_weights(self) -> list[tuple[str, torch.Tensor]]:
        """What a push carries (the whole model's weights in HF naming, or a LoRA adapter); sharded ranks gather
        them (every rank must call this)."""
        if self.sharded:
            from grpo_rl.distributed.sharding import full_named_weights

            return full_named_weights(self.learner.model)
        return [(k, v.detach().to("cpu")) for k, v in self.learner.weights_for_push()]

    def weight_packet(self) -> WeightPacket | None:
        """Rank 0 puts the weights into the object store; the other ranks only take part in the gather."""
        named = self._full_weights()
        return pack_weights(named, self.learner.version) if dist_rank() == 0 else None

    def model_state(self) -> dict[str, torch.Tensor] | None:
        if self.sharded:
            from grpo_rl.distributed.sharding import full_named_weights

            state = dict(full_named_weights(self.learner.model))
        else:
            state = {k: v.detach().to("cpu") for k, v in self.learner.model.state_dict().items()}
        return state if dist_rank() == 0 else None

    def state_dict(self) -> dict | None:
        if self.sharded:
            from grpo_rl.distributed.sharding import full_optimizer_state

            state = {
                **self.learner.state_dict(),
                "optimizer": full_optimizer_state(self.learner.model, self.learner.optimizer),
            }
        else:
            state = self.learner.state_dict()
        return state if dist_rank() == 0 else None

    def load(self, model_state: dict, learner_state: dict) -> None:
        if self.sharded:
            from grpo_rl.distributed.sharding import load_full_model_state, load_full_optimizer_state

            load_full_model_state(self.learner.model, model_state)
            optimizer_state = learner_state["optimizer"]
            self.learner.load_state_dict({**learner_state, "optimizer": self.learner.optimizer.state_dict()})
            load_full_optimizer_state(self.learner.model, self.learner.optimizer, optimizer_state)
        else:
            self.learner.model.load_state_dict(model_state)
            self.learner.load_state_dict(learner_state)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# How long a rank's error waits for a peer's death to be known. A rank killed between steps or mid-collective makes
# its peers' collectives fail at once ("Connection closed by peer"), often before Ray has told this process that the
# killed rank's actor died: that error is the loss of a rank, which a restart heals, not the failure of one.
DEATH_GRACE_SECONDS = 10.0


def gather_ranks(calls: list, what: str, timeout: float | None, pids: list[int], grace: float = DEATH_GRACE_SECONDS):
    """``ray.get`` of one call per rank, in rank order.

    Raises:
        LearnerLost: a rank died (found within ``grace`` seconds of the first error, whichever rank raised it), or
            the ranks did not finish within ``timeout``.
        RoleFailed: a rank raised, and none died.
    """
    import ray

    try:
        return ray.get(calls, timeout=timeout)
    except ray.exceptions.GetTimeoutError as e:
        raise LearnerLost(f"the learner ranks did not finish {what} within pipeline.timeout_seconds={timeout:g}") from e
    except ray.exceptions.RayError as e:
        dead = _dead_rank(calls, grace)
        if dead is not None:
            rank, death = dead
            raise LearnerLost(f"learner rank {rank} (pid {pids[rank]}) died during {what} ({died_how(death)})") from e
        raise RoleFailed(f"a learner rank failed during {what} (its log is above): {e}") from e


def _dead_rank(calls: list, grace: float) -> tuple[int, BaseException] | None:
    """The first rank whose call ended in its actor's death, and that death, waiting up to ``grace`` seconds for
    the calls still running to end; None when none did. (A death ``ray.get`` raised is found at once: its call is
    done.)"""
    import ray

    deadline = time.monotonic() + grace
    while True:
        for rank, call in enumerate(calls):
            death = call_error(call, ray.exceptions.RayActorError)
            if death is not None:
                return rank, death
        pending = ray.wait(calls, num_returns=len(calls), timeout=0)[1]
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            return None
        ray.wait(pending, num_returns=1, timeout=min(0.5, left))


def combine_rank_metrics(results: list[dict]) -> dict:
    """One step's metrics from every rank's: rank 0's diagnostics (summed over ranks inside the step), the micro
    batches of all ranks, and for times (``*_seconds``) the slowest rank's, which is what the group took."""
    metrics = dict(results[0])
    metrics["num_micro_batches"] = float(sum(r["num_micro_batches"] for r in results))
    for key in metrics:
        if key.endswith("_seconds"):
            metrics[key] = max(float(r[key]) for r in results)
    return metrics


def dist_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


class LearnerGroup:
    """``len(run.devices.train)`` learner ranks behind the ``Learner`` interface (module docstring); Ray must be
    running."""

    def __init__(self, run: RunContext):
        import ray

        from grpo_rl.model.loading import load_causal_lm

        placement = run.placement.learner
        world = placement.count
        self.timeout = run.cfg.pipeline.timeout_seconds
        address = node_address()
        self.store = host_store(address, self.timeout)  # listening before any rank is told its port
        self.ranks = [
            ray.remote(LearnerRank)
            .options(**placement.ray_options())
            .remote(
                run.actor_spec("learner", i),
                world_size=world,
                master_address=address,
                master_port=self.store.port,
                timeout=self.timeout,
            )
            for i in range(world)
        ]
        self.pids = wait_ready(self.ranks, "learner rank", run.cfg.pipeline.start_timeout_seconds)
        record_pids(run.run_dir, "learner", self.pids)
        self.lost = False
        sharding = "FSDP2-sharded" if run.cfg.train_model.sharding == "fsdp" else "data-parallel"
        log.info("%s learner: %d ranks, %d threads each", sharding, world, placement.threads)
        self.device = torch.device("cpu")
        self.model = load_causal_lm(run.model_path, self.device, run.cfg.model.dtype, trainable=False)
        self.version = 0
        self.skipped_steps = 0
        self.compiled = False  # each rank compiles its own forward (train.compile); nothing runs compiled here

    def _get(self, calls: list, what: str):
        """One call per rank, their results (:func:`gather_ranks`); a lost rank leaves the group of no further use
        (:attr:`lost`)."""
        if self.lost:
            raise LearnerLost(f"the learner group lost a rank earlier; it cannot do {what}")
        try:
            return gather_ranks(calls, what, self.timeout, self.pids)
        except LearnerLost:
            self.lost = True
            raise

    def train_step(self, batch) -> dict[str, float]:
        """``train.updates_per_batch`` optimizer steps on ``batch`` (see :meth:`Learner.train_step`), split over the
        ranks by whole groups."""
        shards = shard_batch(batch, len(self.ranks))
        results = self._get(
            [r.train_step.remote(s) for r, s in zip(self.ranks, shards, strict=True)], "a training step"
        )
        metrics = combine_rank_metrics(results)
        self.version, self.skipped_steps = metrics.pop("version"), metrics.pop("skipped_steps")
        return metrics

    def observe_step(self, seconds: float) -> None:
        """The ranks time their own steps."""

    def weights_for_push(self) -> WeightPacket:
        """Rank 0's weights (gathered, when sharded) in the Ray object store (see :mod:`grpo_rl.weights.sync`)."""
        return self._get([r.weight_packet.remote() for r in self.ranks], "a weight gather")[0]

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        from grpo_rl.weights.sync import unpack_weights

        return unpack_weights(self.weights_for_push())

    def state_dict(self) -> dict:
        model_state = self._get([r.model_state.remote() for r in self.ranks], "a checkpoint")[0]
        self.model.load_state_dict(model_state)
        return self._get([r.state_dict.remote() for r in self.ranks], "a checkpoint")[0]

    def load_state_dict(self, state: dict) -> None:
        model_state = {k: v.detach() for k, v in self.model.state_dict().items()}
        self._get([r.load.remote(model_state, state) for r in self.ranks], "a resume")
        self.version, self.skipped_steps = state["version"], state["skipped_steps"]

    def shutdown(self) -> None:
        import ray

        for r in self.ranks:
            try:
                if not self.lost:  # the survivors of a lost group would wait on the dead rank
                    ray.get(r.shutdown.remote(), timeout=30)
                ray.kill(r)
            except Exception as e:  # already gone
                log.debug("learner rank shutdown: %s", e)
        self.store = None  # stops listening
