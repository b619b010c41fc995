"""The reference model as a pipeline stage of its own: ``ref_model.num_devices`` actors, one batch sharded over them.

:class:`ReferenceActors` has the reference scorer's interface (``score(batch)`` adds ``ref_logprobs``), so the
synchronous loop uses it where it would use an in-process :class:`~grpo_rl.training.reference.RefScorer`. In the
asynchronous loop it sits between the buffer and the learner (:class:`~grpo_rl.distributed.pipeline.AsyncRollouts`)
and scores the next batch while the learner trains on the current one. A batch is cut into whole groups, about
equal in rows, one shard per replica (:func:`~grpo_rl.distributed.data_parallel.shard_batch`).
"""

from __future__ import annotations

import logging
import time

import torch
from tensordict import TensorDict

from grpo_rl.distributed.actors import RefWorker
from grpo_rl.distributed.data_parallel import shard_batch
from grpo_rl.distributed.healing import Restarts, died_how, record_pids
from grpo_rl.errors import RoleFailed
from grpo_rl.placement.context import RunContext

log = logging.getLogger(__name__)


class ReferenceActors:
    """``len(run.placement.reference.devices)`` reference replicas as Ray actors; one that dies or does not answer
    within ``timeout`` seconds is replaced and the batch scored again, within ``restarts``."""

    def __init__(self, run: RunContext, timeout: float, restarts: Restarts | None = None, *, wait: bool = True):
        self.run, self.timeout = run, timeout
        self.restarts = restarts if restarts is not None else Restarts(run.cfg.pipeline.max_restarts, run.run_dir)
        self.restarts.register("reference")
        self.actors = [self._new_replica(i) for i in range(run.placement.reference.count)]
        self.pids: list[int] | None = None
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Wait (once) until every replica has started. Raises :class:`RoleFailed` naming the role if one fails or
        takes past the timeout."""
        if self.pids is None:
            self.pids = wait_ready(self.actors, "reference replica", self.run.cfg.pipeline.start_timeout_seconds)
            record_pids(self.run.run_dir, "reference", self.pids)

    def _new_replica(self, index: int):
        import ray

        options = self.run.placement.reference.ray_options(scheduling_strategy="SPREAD")
        return ray.remote(RefWorker).options(**options).remote(self.run.actor_spec("reference", index))

    def submit(self, batch: TensorDict) -> list:
        """Start scoring ``batch`` (one shard per replica); pass the result to :meth:`collect`."""
        self.wait_started()
        shards = [s for s in shard_batch(batch, len(self.actors)) if s.batch_size[0] > 0]
        keys = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_id")
        # empty shards were dropped above, so a small batch leaves the last replicas idle
        return [a.score.remote(s.select(*keys)) for a, s in zip(self.actors, shards, strict=False)]

    def collect(self, batch: TensorDict, pending: list) -> TensorDict:
        """Wait for :meth:`submit`'s shards and add their ``ref_logprobs`` ``[N, Lr]`` to ``batch``; a replica lost
        meanwhile is replaced and the batch scored again."""
        while True:
            parts, lost = self._wait(pending)
            if not lost:
                break
            for index, cause, error in lost:
                self.replace(index, cause, error)
            pending = self.submit(batch)
        batch.set("ref_logprobs", torch.cat(parts) if parts else torch.zeros(batch["response_ids"].shape))
        return batch

    def _wait(self, pending: list) -> tuple[list, list[tuple[int, str, BaseException | None]]]:
        """The shards' results, or the replicas that died or did not answer (index, cause, error)."""
        import ray

        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=self.timeout)
        parts, lost = [], []
        for index, call in enumerate(pending):
            if call not in ready:
                lost.append((index, f"did not answer within pipeline.timeout_seconds={self.timeout:g}", None))
                continue
            try:
                parts.append(ray.get(call))
            except ray.exceptions.RayActorError as e:
                lost.append((index, f"died ({died_how(e)})", e))
            except ray.exceptions.RayError as e:
                raise RoleFailed(f"reference replica {index} failed (its log is above): {e}") from e
        return parts, lost

    def replace(self, index: int, cause: str, error: BaseException | None = None) -> None:
        """Kill reference replica ``index`` and start another on its devices.

        Raises:
            RoleFailed: naming the replica and ``cause``, past ``pipeline.max_restarts`` or when the replacement
                does not start.
        """
        import ray

        who = f"reference replica {index} (pid {self.pids[index]})"
        if not self.restarts.allowed("reference"):
            hint = "; raise it if one batch takes the reference that long" if error is None else "; its log is above"
            raise RoleFailed(f"{who} {cause}; {self.restarts.exhausted('reference')}{hint}") from error
        log.warning("%s %s: replacing it", who, cause)
        t0 = time.perf_counter()
        try:
            ray.kill(self.actors[index], no_restart=True)
        except Exception as e:  # noqa: BLE001 - already gone
            log.debug("reference replica %d: kill: %s", index, e)
        self.actors[index] = self._new_replica(index)
        try:
            start = self.run.cfg.pipeline.start_timeout_seconds
            self.pids[index] = wait_ready([self.actors[index]], "replacement reference replica", start)[0]
        except RoleFailed as e:
            raise RoleFailed(f"{who} {cause}, and its replacement failed: {e}") from error
        self.restarts.record("reference", index, cause, time.perf_counter() - t0, pid=self.pids[index])
        record_pids(self.run.run_dir, "reference", self.pids)

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
            raise RoleFailed(f"a {role} did not start within pipeline.start_timeout_seconds={timeout:g}") from e
        if isinstance(e, ray.exceptions.RayError):
            raise RoleFailed(f"a {role} failed to start (its log is above): {e}") from e
        raise
