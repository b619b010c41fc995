"""A collective weight broadcast from the learner to the rollout engines: gloo on the CPU, NCCL on GPUs.

The learner is rank 0 of a small group of its own and every engine process is one of ranks 1..N. A push is a
few broadcasts from rank 0, each of bytes in a uint8 tensor on the transport's device:

1. the header ``[version, layout_nbytes]`` (int64);
2. the layout (:class:`WeightLayout` as JSON), only when it changed since the previous push (``layout_nbytes``
   is 0 otherwise);
3. the tensors, packed into one flat buffer per dtype (split where a buffer would pass ``bucket_bytes``).

Tied weights (``lm_head.weight`` = ``model.embed_tokens.weight``) cross once and arrive under both names, as in
:mod:`grpo_rl.weights.sync`: vLLM's in-place reload must see ``lm_head.weight`` too.

The group is standalone, as vLLM's ``StatelessProcessGroup`` is: a ``TCPStore`` hosted by rank 0 and a
``ProcessGroupGloo`` or ``ProcessGroupNCCL`` built on it directly, never ``init_process_group``. An engine process
whose in-process vLLM already owns the default process group can therefore join, and that group is left alone.
Rank 0's store listens on the rendezvous address only, and every member's gloo or NCCL connections use its own
address on the route to it: loopback when the rendezvous is (one machine), never every interface.
Every blocking step (joining, each broadcast) ends after ``timeout_seconds`` with :class:`TransportTimeout`, so
a receiver calls :meth:`WeightBroadcast.receive` when the learner has announced a push, not to idle-wait for one.

Departures from the object-store transport (:mod:`grpo_rl.weights.sync`) and limits:

* :meth:`WeightBroadcast.send` returns when every receiver has the weights, so the learner waits for the
  slowest engine to reach :meth:`~WeightBroadcast.receive` (the object store costs the learner a ``ray.put``).
* A receiver's ``TCPStore`` retries its connection once after a back-off, so joining a learner that is not there
  fails after about twice ``timeout_seconds`` (6 s for 3 s in torch 2.13); every later step keeps to the limit.
* A gloo push's time on the CPU is in benchmarks/README.md, "Measurements behind library defaults" (no script
  reproduces it yet); the NCCL path is untested here (no GPU).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from grpo_rl.errors import RoleFailed
from grpo_rl.placement.ray import address_towards, host_store, interface_with_address
from grpo_rl.weights.sync import split_aliases

DEFAULT_BUCKET_BYTES = 1 << 30


class TransportTimeout(RoleFailed):
    """A step of the weight broadcast did not complete within ``timeout_seconds``, or its peer went away; the
    transport is closed, connect a new one to go on."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in the flat buffers: buffer index, offset in elements, and shape."""

    name: str
    buffer: int
    offset: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class WeightLayout:
    """What one push carries: the flat ``buffers`` as ``(dtype name, numel)``, each tensor's slot in them, and
    ``aliases`` (``{alias: name}``) for tied tensors, which take no slot."""

    buffers: tuple[tuple[str, int], ...]
    slots: tuple[TensorSlot, ...]
    aliases: dict[str, str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> WeightLayout:
        raw = json.loads(data)
        return cls(
            buffers=tuple((dtype, numel) for dtype, numel in raw["buffers"]),
            slots=tuple(TensorSlot(s["name"], s["buffer"], s["offset"], tuple(s["shape"])) for s in raw["slots"]),
            aliases=raw["aliases"],
        )


def plan_layout(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> tuple[WeightLayout, list[torch.Tensor]]:
    """The layout of ``named`` (grouped by dtype, split at ``bucket_bytes``) and its unique tensors, one per slot in
    slot order."""
    unique, aliases = split_aliases(named)
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, t in unique.items():
        by_dtype.setdefault(t.dtype, []).append((name, t))
    buffers: list[tuple[str, int]] = []
    slots: list[TensorSlot] = []
    tensors: list[torch.Tensor] = []
    for dtype, group in by_dtype.items():
        dtype_name, numel = str(dtype).removeprefix("torch."), 0
        for name, t in group:
            # a new buffer before one would pass bucket_bytes: it bounds the extra memory a push takes on either side
            if numel and (numel + t.numel()) * t.element_size() > bucket_bytes:
                buffers.append((dtype_name, numel))
                numel = 0
            slots.append(TensorSlot(name, len(buffers), numel, tuple(t.shape)))
            tensors.append(t)
            numel += t.numel()
        buffers.append((dtype_name, numel))
    return WeightLayout(tuple(buffers), tuple(slots), aliases), tensors


def _make_group(
    store: dist.Store, rank: int, world_size: int, device: torch.device, timeout: timedelta, local_address: str
):
    """A process group outside torch.distributed's global state: NCCL for ``cuda``, gloo for ``cpu``; its own
    connections listen on ``local_address`` only."""
    if device.type == "cuda":
        # NCCL takes its interface from the environment alone, when it first starts in this process
        os.environ["NCCL_SOCKET_IFNAME"] = interface_with_address(local_address)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    if device.type == "cpu":
        # without a device gloo binds whatever this machine's host name resolves to, or GLOO_SOCKET_IFNAME's
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address)]
        options._timeout, options._threads = timeout, 2  # 2 threads per device, as torch's own default
        return dist.ProcessGroupGloo(store, rank, world_size, options)
    raise ValueError(f"weight broadcast: no backend for device {device} (cuda: NCCL, cpu: gloo)")


class WeightBroadcast:
    """One member of the weight-broadcast group: the sender (rank 0, the learner) or a receiver (an engine); build
    it with :meth:`connect` (wire format: module docstring)."""

    def __init__(
        self,
        group,
        store: dist.Store,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        timeout_seconds: float,
        where: str,
        bucket_bytes: int,
    ):
        self._group, self._store = group, store
        self.rank, self.world_size, self.device = rank, world_size, device
        self.timeout_seconds, self.where, self.bucket_bytes = timeout_seconds, where, bucket_bytes
        self._layout: WeightLayout | None = None
        self._layout_bytes = b""

    @classmethod
    def connect(
        cls,
        address: str,
        port: int,
        rank: int,
        world_size: int,
        device: torch.device | str,
        timeout_seconds: float,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        store: dist.TCPStore | None = None,
    ) -> WeightBroadcast:
        """Join the group as ``rank`` (0: the learner, 1..world_size-1: the engine processes); returns once all
        ``world_size`` members have joined.

        Args:
            address, port: the rendezvous, which rank 0 hosts (a ``TCPStore`` listening on ``address:port`` only).
            device: where the buffers live; ``cuda`` uses NCCL, ``cpu`` gloo.
            timeout_seconds: the limit of each blocking step (``pipeline.timeout_seconds``).
            bucket_bytes: the size at which a dtype's flat buffer is split (sender side).
            store: rank 0's store, already listening (:func:`~grpo_rl.placement.ray.host_store`, whose free port
                the receivers were given); without it rank 0 hosts one on ``address:port``.

        Raises:
            TransportTimeout: a member did not join in time.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"weight broadcast: rank {rank} is not in 0..{world_size - 1}")
        device = torch.device(device)
        timeout = timedelta(seconds=timeout_seconds)
        member = cls(
            None,
            None,
            rank=rank,
            world_size=world_size,
            device=device,
            timeout_seconds=timeout_seconds,
            where=f"{address}:{port}",
            bucket_bytes=bucket_bytes,
        )
        try:
            if rank == 0:
                store = store or host_store(address, timeout_seconds, port=port)
            else:
                store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
            member._store = store
            member._group = _make_group(
                dist.PrefixStore("grpo_rl/weights", store), rank, world_size, device, timeout, address_towards(address)
            )
            store.barrier("grpo_rl/weights/joined", world_size, timeout)  # NCCL's group connects at its first use
        except (RuntimeError, OSError) as e:  # DistNetworkError, DistStoreError and gloo's errors are all RuntimeErrors
            raise TransportTimeout(member._describe("joining the group", e)) from e
        return member

    def _describe(self, step: str, error: BaseException) -> str:
        cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if self.rank == 0:
            who = f"weight sender (rank 0, the learner, hosting {self.where})"
            peer = f"the engines (ranks 1..{self.world_size - 1})"
        else:
            who = f"weight receiver (rank {self.rank} of {self.world_size}, an engine)"
            peer = f"the learner (rank 0 at {self.where})"
        return (
            f"{who}: {step} with {peer} failed or took more than {self.timeout_seconds:g} s ({cause}). If the "
            f"peer is alive but slow (a large model, a busy machine), raise pipeline.timeout_seconds."
        )

    def _broadcast(self, tensor: torch.Tensor, step: str) -> None:
        """Broadcast ``tensor`` from rank 0 in place, within the timeout."""
        if self._group is None:
            raise RuntimeError("weight broadcast: the transport is closed")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = timedelta(seconds=self.timeout_seconds)
        try:
            self._group.broadcast([tensor], options).wait(timeout=options.timeout)
        except RuntimeError as e:
            self.close()  # a half-done broadcast leaves the group unusable
            raise TransportTimeout(self._describe(step, e)) from e

    def send(self, named_weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Broadcast ``named_weights`` tagged ``version`` to every receiver; returns when all have them.

        Raises:
            TransportTimeout: a receiver did not take a part within ``timeout_seconds``.
        """
        if self.rank != 0:
            raise RuntimeError(f"weight broadcast: rank {self.rank} receives; only rank 0 sends")
        layout, tensors = plan_layout(named_weights, self.bucket_bytes)
        layout_bytes = layout.to_bytes()
        changed = layout_bytes != self._layout_bytes
        header = torch.tensor([version, len(layout_bytes) if changed else 0], dtype=torch.int64, device=self.device)
        self._broadcast(header, f"the header of version {version}")
        if changed:
            raw = torch.frombuffer(bytearray(layout_bytes), dtype=torch.uint8).to(self.device)  # [nbytes]
            self._broadcast(raw, "the layout")
            self._layout, self._layout_bytes = layout, layout_bytes
        per_buffer: list[list[tuple[TensorSlot, torch.Tensor]]] = [[] for _ in layout.buffers]
        for slot, t in zip(layout.slots, tensors, strict=True):
            per_buffer[slot.buffer].append((slot, t))
        for index, (dtype, numel) in enumerate(layout.buffers):
            if numel == 0:
                continue
            flat = torch.empty(numel, dtype=getattr(torch, dtype), device=self.device)  # [numel]
            for slot, t in per_buffer[index]:
                flat[slot.offset : slot.offset + t.numel()].copy_(t.detach().reshape(-1))
            self._broadcast(flat.view(torch.uint8), f"buffer {index} ({dtype}) of version {version}")

    def receive(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        """The next push: its version and ``(name, tensor)`` pairs, aliases included, on the transport's device, as
        views into the received buffers.

        Raises:
            TransportTimeout: the learner did not send a part within ``timeout_seconds``.
        """
        if self.rank == 0:
            raise RuntimeError("weight broadcast: rank 0 sends; ranks 1.. receive")
        header = torch.zeros(2, dtype=torch.int64, device=self.device)  # [version, layout_nbytes]
        self._broadcast(header, "the header of the next push")
        version, nbytes = header.tolist()
        if nbytes:
            raw = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # [nbytes]
            self._broadcast(raw, "the layout")
            self._layout = WeightLayout.from_bytes(raw.cpu().numpy().tobytes())
        if self._layout is None:
            raise RuntimeError("weight broadcast: the first push came without a layout (sender and receiver differ)")
        buffers = []
        for index, (dtype, numel) in enumerate(self._layout.buffers):
            flat = torch.empty(numel, dtype=getattr(torch, dtype), device=self.device)  # [numel]
            if numel:
                self._broadcast(flat.view(torch.uint8), f"buffer {index} ({dtype}) of version {version}")
            buffers.append(flat)
        tensors = {
            s.name: buffers[s.buffer][s.offset : s.offset + math.prod(s.shape)].view(s.shape)
            for s in self._layout.slots
        }
        return version, list(tensors.items()) + [(alias, tensors[name]) for alias, name in self._layout.aliases.items()]

    def close(self) -> None:
        """Leave the group (idempotent); data still in flight is lost, so the sender closes after the receivers
        have reported the last push."""
        if self._group is not None:
            self._group.abort()  # not a shutdown: a peer may be gone or mid-broadcast
        self._group, self._store = None, None
