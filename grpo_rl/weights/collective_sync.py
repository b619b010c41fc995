"""The collective weight sync: the driver's learner broadcasts to every collector's engine (gloo or NCCL).

A :class:`~grpo_rl.weights.sync.WeightSync` over :class:`~grpo_rl.weights.collective.WeightBroadcast`. The
learner is rank 0, collector replica ``i`` is rank ``1 + i``. A push announces itself to every collector (a Ray
call that makes it :meth:`~grpo_rl.distributed.actors.CollectorWorker.receive_weights` in a thread of its own, next
to generation), broadcasts, and waits for every receiver; the collectors load the weights between two generation
calls, as with the object store. Every step has ``pipeline.timeout_seconds``: a dead or stuck collector ends the
push with :class:`~grpo_rl.errors.RoleFailed` naming it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from grpo_rl.errors import RoleFailed
from grpo_rl.placement.ray import host_store, node_address
from grpo_rl.weights.collective import WeightBroadcast
from grpo_rl.weights.sync import WeightPacket, unpack_weights, wait_for_collectors


class CollectiveWeightSync:
    """Broadcast pushes from this process, the learner's (``cuda``: NCCL; ``cpu``: gloo), to ``collectors``, each
    step within ``timeout`` seconds."""

    def __init__(self, collectors: Sequence[Any], *, device: torch.device, timeout: float):
        self.collectors, self.timeout = list(collectors), timeout
        address, world = node_address(), 1 + len(self.collectors)  # loopback on one machine
        store = host_store(address, timeout)  # listening before any collector is told its port
        joins = [c.connect_collective.remote(address, store.port, world) for c in self.collectors]
        self.group = WeightBroadcast.connect(address, store.port, 0, world, device, timeout, store=store)
        self._wait(joins, "joining the weight broadcast")

    def _wait(self, calls: list, what: str) -> list:
        return wait_for_collectors(calls, what, self.timeout)

    def push(self, weights, version: int) -> float:
        t0 = time.perf_counter()
        named = unpack_weights(weights) if isinstance(weights, WeightPacket) else list(weights)
        receipts = [c.receive_weights.remote() for c in self.collectors]
        self.group.send(named, version)
        self._wait(receipts, "receiving weights")
        return time.perf_counter() - t0

    def delivered(self) -> float:
        """A push returns once every collector holds it."""
        return 0.0

    can_replace = False
    """A lost collector ends the run (see :meth:`send_newest`)."""

    def send_newest(self, replica: int, actor) -> None:
        """A broadcast group has a fixed set of ranks: a replacement collector cannot join it."""
        raise RoleFailed(
            f"collector replica {replica} was lost, and pipeline.weight_transport=collective cannot "
            "give a replacement its weights (its broadcast group is fixed at start); use "
            "pipeline.weight_transport=object_store to have lost collectors replaced"
        )

    def push_again(self) -> None:
        """The collectors' engines are replaced with their collectors, which this transport cannot serve."""

    def close(self) -> None:
        self.group.close()
