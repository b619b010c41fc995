"""The reference model as a pipeline stage of its own: ``ref_model.num_devices`` actors, one batch sharded over them.

:class:`ReferenceActors` has the reference scorer's interface (``score(batch)`` adds ``ref_logprobs``), so the
synchronous loop uses it where it would use an in-process :class:`~grpo_rl.training.reference.RefScorer`. In the
asynchronous loop it sits between the buffer and the learner (:class:`~grpo_rl.distributed.pipeline.AsyncRollouts`)
and scores the next batch while the learner trains on the current one. A batch is cut into whole groups, about
equal in rows, one shard per replica (:func:`~grpo_rl.distributed.data_parallel.shard_batch`).
"""
from __future__ import annotations

import logging

import torch
from tensordict import TensorDict

from grpo_rl.distributed.actors import RefWorker
from grpo_rl.distributed.data_parallel import shard_batch
from grpo_rl.errors import RoleFailed
from grpo_rl.placement.context import RunContext

log = logging.getLogger(__name__)


class ReferenceActors:
    """``len(run.placement.reference.devices)`` reference replicas as Ray actors.

    Args:
        run: the run context (Ray must be running).
        timeout: seconds one scoring call may take (``pipeline.timeout_seconds``).
    """

    def __init__(self, run: RunContext, timeout: float):
        import ray

        placement = run.placement.reference
        self.timeout = timeout
        self.actors = [ray.remote(RefWorker).options(**placement.ray_options()).remote(run.actor_spec("reference", i))
                       for i in range(placement.count)]
        self.pids = wait_ready(self.actors, "reference replica", timeout)

    def submit(self, batch: TensorDict) -> list:
        """Start scoring ``batch`` (one shard per replica); pass the result to :meth:`collect`."""
        shards = [s for s in shard_batch(batch, len(self.actors)) if s.batch_size[0] > 0]
        keys = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_id")
        return [a.score.remote(s.select(*keys)) for a, s in zip(self.actors, shards)]

    def collect(self, batch: TensorDict, pending: list) -> TensorDict:
        """Wait for :meth:`submit`'s shards and add their ``ref_logprobs`` ``[N, Lr]`` to ``batch``."""
        import ray

        try:
            parts = ray.get(pending, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise RoleFailed(f"a reference replica did not answer within pipeline.timeout_seconds={self.timeout:g}; "
                             "raise it if one batch takes the reference that long") from e
        except ray.exceptions.RayError as e:
            raise RoleFailed(f"a reference replica failed (its log is above): {e}") from e
        batch.set("ref_logprobs", torch.cat(parts) if parts else torch.zeros(batch["response_ids"].shape))
        return batch

    def score(self, batch: TensorDict) -> TensorDict:
        return self.collect(batch, self.submit(batch))

    def compile(self) -> None:
        """Each replica follows ``train.compile`` in its own process."""

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception as e:  # already gone
                log.debug("reference replica shutdown: %s", e)


def wait_ready(actors: list, role: str, timeout: float) -> list[int]:
    """Wait for every actor's ``ready()`` (its process id); kill them all and raise :class:`RoleFailed` if one
    fails or takes longer than ``timeout`` seconds to start."""
    import ray

    try:
        return ray.get([a.ready.remote() for a in actors], timeout=timeout)
    except BaseException as e:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - never started
                pass
        if isinstance(e, ray.exceptions.GetTimeoutError):
            raise RoleFailed(f"a {role} did not start within pipeline.timeout_seconds={timeout:g}") from e
        if isinstance(e, ray.exceptions.RayError):
            raise RoleFailed(f"a {role} failed to start (its log is above): {e}") from e
        raise
