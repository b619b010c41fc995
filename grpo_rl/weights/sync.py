"""Moving the learner's weights into the rollout engine(s), behind one protocol.

:class:`WeightSync` is what both loops call after an update (the asynchronous one every ``pipeline.push_every``
optimizer steps): ``push(weights, version)``. Three implementations:

* :class:`InPlaceWeightSync` (``sota/grpo.py``): the engine lives in this process; its ``update_weights``
  reloads the weights in place.
* :class:`ObjectStoreWeightSync` (``pipeline.weight_transport=object_store``, the default on the CPU): the
  weights go into Ray's shared-memory object store as numpy arrays; each collector maps them zero-copy, loads them
  into its engine between two generation calls and from then on stamps its samples with the new
  ``policy_version``. The learner does not wait for the engines: a push costs it the ``ray.put`` only. The
  collectors are threaded actors, so a later call (an evaluation) may run before an earlier ``set_weights``:
  :meth:`~ObjectStoreWeightSync.delivered` waits until every collector holds the last push.
* :class:`~grpo_rl.weights.collective_sync.CollectiveWeightSync` (``collective``, the default on GPUs): one
  broadcast from the learner to every engine over a process group of their own, NCCL between GPUs and gloo on the
  CPU, the same code (:mod:`grpo_rl.weights.collective`).

Why numpy arrays in the object store, not torch tensors or safetensors bytes: numpy arrays are written once into
shared memory and read without a copy; pickled tensors are copied on both sides, and safetensors serialises into a
bytes object (one copy), which Ray then copies into the store and the receiver copies out again. Of the three it
was measured fastest end to end (pack + transfer + unpack; see ``benchmarks/micro/weight_transport.py``).

Tied weights (``lm_head`` = ``embed_tokens``) cross once and arrive under both names: vLLM's in-place reload
must see ``lm_head.weight`` too, or it puts the LM head's old kernel tensors back ("ParallelLMHead: Failed
to load weights") and the engine samples from a stale head.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from grpo_rl.engines.base import split_aliases
from grpo_rl.errors import RoleFailed

# numpy has no bfloat16: such tensors travel as int16 bit patterns and are viewed back on arrival.
_NUMPY_LESS = {torch.bfloat16: torch.int16}


def unique_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``named`` without tensors that alias an earlier one (tied embeddings)."""
    yield from split_aliases(named)[0].items()


@dataclass(frozen=True)
class WeightPacket:
    """A state dict in the object store, stamped with the learner version it holds."""

    version: int
    refs: list  # one ObjectRef in a list, so that Ray passes it through calls instead of resolving it
    aliases: dict


def pack_weights(named: Iterable[tuple[str, torch.Tensor]], version: int) -> WeightPacket:
    """Copy ``named`` into the Ray object store (runs where the weights live: the driver or learner rank 0)."""
    import ray

    unique, aliases = split_aliases(named)
    arrays: dict[str, tuple[Any, str]] = {}
    for name, t in unique.items():
        t = t.detach().to("cpu").contiguous()
        as_int = _NUMPY_LESS.get(t.dtype)
        arrays[name] = ((t.view(as_int) if as_int is not None else t).numpy(), str(t.dtype).split(".")[-1])
    return WeightPacket(version=version, refs=[ray.put(arrays)], aliases=aliases)


def unpack_weights(packet: WeightPacket) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of ``packet``, read-only views of the shared-memory copy (no copy made)."""
    import ray

    arrays = ray.get(packet.refs[0])
    tensors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the arrays are read-only; the engine copies them
        for name, (array, dtype) in arrays.items():
            t = torch.from_numpy(array)
            tensors[name] = t.view(getattr(torch, dtype)) if t.dtype != getattr(torch, dtype) else t
    return list(tensors.items()) + [(alias, tensors[name]) for alias, name in packet.aliases.items()]


class WeightSync(Protocol):
    """Pushes the learner's weights, tagged with its policy version, to every engine."""

    def push(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Send ``weights`` (HF-named ``(name, tensor)`` pairs, or a :class:`WeightPacket` already in the object
        store); samples generated afterwards carry ``version``. Returns the seconds the caller was blocked."""
        ...

    def delivered(self) -> float:
        """Block until every engine holds the last push (it loads it before its next generation or evaluation);
        the seconds blocked."""
        ...

    can_replace: bool
    """Whether a lost collector can be replaced: its replacement can be given the newest push
    (:meth:`send_newest`)."""

    def send_newest(self, replica: int, actor) -> None:
        """Give ``actor``, the replacement of collector ``replica``, the newest push (none before the first: it
        starts from the model's own weights). Raises :class:`~grpo_rl.errors.RoleFailed` where ``can_replace`` is
        False."""
        ...

    def push_again(self) -> None:
        """Push the newest weights once more, to engines started again in place (nothing before the first push)."""
        ...

    def close(self) -> None: ...


class InPlaceWeightSync:
    """The engine is in this process: reload its weights in place (``engine.update_weights``)."""

    def __init__(self, engine):
        self.engine = engine
        self.version = 0
        self._newest = None

    def push(self, weights, version: int) -> float:
        t0 = time.perf_counter()
        weights = unpack_weights(weights) if isinstance(weights, WeightPacket) else list(weights)
        self.engine.update_weights(weights, version=version)
        self.version, self._newest = version, weights
        return time.perf_counter() - t0

    def push_again(self) -> None:
        """Push the newest weights once more (to an engine server started again); nothing before the first push:
        a new server loads the model's own weights, version 0."""
        if self._newest is not None:
            self.engine.update_weights(self._newest, version=self.version)

    def delivered(self) -> float:
        """A push here is done when it returns."""
        return 0.0

    can_replace = False
    """No collector actors: the engine is this process's."""

    def send_newest(self, replica: int, actor) -> None:
        raise RoleFailed(
            f"collector replica {replica} was lost, but the engine of this weight sync is in the "
            "driver: there is no collector actor to replace"
        )

    def close(self) -> None:
        """The engine is shut down by its owner."""


class ObjectStoreWeightSync:
    """CPU transport through Ray's object store (module docstring) to the ``collectors``, waiting up to ``timeout``
    seconds for the previous push's delivery."""

    def __init__(self, collectors: list[Any], timeout: float | None = None, *, lost_ok: bool = False):
        self.collectors = collectors  # the rollout source's own list: a replaced collector gets the next push
        self.timeout = timeout
        self.lost_ok = lost_ok
        self._inflight: list = []
        self._newest: WeightPacket | None = None

    def push(self, weights, version: int) -> float:
        t0 = time.perf_counter()
        # Surfaces a failure of the previous push; these calls return at once.
        wait_for_collectors(
            self._inflight, "taking the weights of the previous push", self.timeout, lost_ok=self.lost_ok
        )
        packet = weights if isinstance(weights, WeightPacket) else pack_weights(weights, version)
        self._newest = packet
        self._inflight = [c.set_weights.remote(packet) for c in self.collectors]
        return time.perf_counter() - t0

    def delivered(self) -> float:
        t0 = time.perf_counter()
        wait_for_collectors(self._inflight, "taking the weights of the last push", self.timeout, lost_ok=self.lost_ok)
        return time.perf_counter() - t0

    can_replace = True
    """A lost collector's replacement can be given the newest push (:meth:`send_newest`)."""

    def send_newest(self, replica: int, actor) -> None:
        """Give ``actor``, the replacement of collector ``replica``, the newest push (nothing before the first:
        it starts from the model's own weights, version 0)."""
        if self._newest is None:
            return
        call = actor.set_weights.remote(self._newest)
        wait_for_collectors([call], "taking the newest weights as a replacement", self.timeout)
        if replica < len(self._inflight):
            self._inflight[replica] = call

    def push_again(self) -> None:
        """The collectors' engines are replaced with their collectors, which :meth:`send_newest` serves."""

    def close(self) -> None:
        self._inflight = []


def wait_for_collectors(calls: list, what: str, timeout: float | None, *, lost_ok: bool = False) -> list:
    """``ray.get`` of one call per collector replica (call ``i`` to replica ``i``) within ``timeout`` seconds; with
    ``lost_ok`` (the replacement gets the newest push) a call to an actor that died returns None.

    Raises:
        RoleFailed: on one line, naming the replica that died or failed while doing ``what`` (its own log, above,
            has the details), or that a collector did not answer in time.
    """
    import ray

    try:
        return ray.get(calls, timeout=timeout)
    except ray.exceptions.GetTimeoutError as e:
        raise RoleFailed(f"a collector did not finish {what} within pipeline.timeout_seconds={timeout:g}") from e
    except ray.exceptions.RayError as e:
        if lost_ok and isinstance(e, ray.exceptions.RayActorError):
            return [_unless_lost(i, call, what, timeout) for i, call in enumerate(calls)]
        replica = next((i for i, call in enumerate(calls) if call_error(call) is not None), None)
        who = "a collector" if replica is None else f"collector replica {replica}"
        how = "died" if isinstance(e, ray.exceptions.RayActorError) else "failed"
        raise RoleFailed(f"{who} {how} while {what}: {type(e).__name__}; its log is above") from e


def _unless_lost(replica: int, call, what: str, timeout: float | None):
    """The result of ``call`` to collector ``replica``; None if the actor died (it is being replaced)."""
    import ray

    try:
        return ray.get(call, timeout=timeout)
    except ray.exceptions.RayActorError:
        return None
    except ray.exceptions.RayError as e:
        raise RoleFailed(
            f"collector replica {replica} failed while {what}: {type(e).__name__}; its log is above"
        ) from e


def call_error(call, error: type[BaseException] | None = None) -> BaseException | None:
    """The Ray error (of type ``error``, default any) the Ray ``call`` finished with; None while it runs or when it
    returned."""
    import ray

    if not ray.wait([call], timeout=0)[0]:
        return None
    try:
        ray.get(call)
    except ray.exceptions.RayError as e:
        return e if isinstance(e, error or ray.exceptions.RayError) else None
    return None
