"""Moving the learner's weights into the rollout engine(s) of the asynchronous loop, behind one protocol.

:class:`WeightSync` is what the loop calls every ``pipeline.push_every`` optimizer steps. Two implementations:

* :class:`ObjectStoreWeightSync` (CPU, and any machine): the learner puts its state dict into Ray's shared-
  memory object store as numpy arrays; each collector maps them zero-copy, loads them into its engine with
  ``engine.update_weights`` and from then on stamps its samples with the new ``policy_version``. The learner
  does not wait for the engine: a push costs it the ``ray.put`` only, and the collector applies the newest
  weights between two generation calls.
* :class:`NCCLWeightSync` (GPU only): an NCCL broadcast from the learner's GPU to every engine worker through
  vLLM 0.32's weight-transfer engine (``weight_transfer_config={"backend": "nccl"}`` on the engine,
  ``NCCLTrainerWeightTransferEngine`` on the learner, the worker side driven through
  ``LLM.collective_rpc``). It cannot run on this machine (no GPU, no NCCL) and is untested here; it imports
  vLLM lazily and stays small on purpose.

Why the object store and not safetensors bytes (``python benchmarks/weight_transport.py --repeats 7``;
2-core CPU box shared with other jobs, load average 11-14; local Ray; median of 7 with the variants
interleaved; "total" = pack on the sender + transfer + unpack in another process, engine reload excluded)::

    model                   size      object store (numpy)   object store (torch)   safetensors bytes
    tiny (h64, 49k vocab)   12.3 MiB  0.032 s                0.055 s                0.074 s
    SmolLM2-135M            513 MiB   0.39 s                 1.98 s                 1.41 s

numpy arrays are written once into shared memory and read without a copy; safetensors serialises into a
bytes object (one copy), which Ray then copies into the store and the receiver copies out again.

Tied weights (``lm_head`` = ``embed_tokens``) cross once and arrive under both names: vLLM's in-place reload
must see ``lm_head.weight`` too, or it puts the LM head's old kernel tensors back ("ParallelLMHead: Failed
to load weights") and the engine samples from a stale head.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, Sequence

import torch

# numpy has no bfloat16: such tensors travel as int16 bit patterns and are viewed back on arrival.
_NUMPY_LESS = {torch.bfloat16: torch.int16}


def split_aliases(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors of ``named`` keyed by name, each storage once, and ``{alias: name}`` for tied ones (first wins)."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[int, int, tuple], str] = {}
    for name, t in named:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            unique[name] = t
    return unique, aliases


def unique_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``named`` without tensors that alias an earlier one (tied embeddings)."""
    yield from split_aliases(named)[0].items()


@dataclass(frozen=True)
class WeightPacket:
    """A state dict in the object store, stamped with the learner version it holds.

    ``refs`` is a one-element list so that Ray passes the ``ObjectRef`` through calls instead of resolving it.
    """

    version: int
    refs: list
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


def learner_packet(learner) -> WeightPacket:
    """The learner's current weights as a packet; a data-parallel group packs on its rank 0."""
    if hasattr(learner, "weight_packet"):
        return learner.weight_packet()
    return pack_weights(learner.named_weights(), learner.version)


class WeightSync(Protocol):
    """Pushes the learner's weights to every collector's engine."""

    def push(self, learner) -> float:
        """Send ``learner``'s weights (tagged ``learner.version``); return the seconds the learner was blocked."""
        ...

    def close(self) -> None: ...


class ObjectStoreWeightSync:
    """CPU transport through Ray's object store; see the module docstring.

    Args:
        collectors: collector actor handles (:class:`grpo_rl.distributed.actors.CollectorWorker`).
    """

    def __init__(self, collectors: Sequence[Any]):
        self.collectors = list(collectors)
        self._inflight: list = []

    def push(self, learner) -> float:
        import ray

        t0 = time.perf_counter()
        ray.get(self._inflight)  # surfaces a failure of the previous push; these calls return at once
        packet = learner_packet(learner)
        self._inflight = [c.set_weights.remote(packet) for c in self.collectors]
        return time.perf_counter() - t0

    def close(self) -> None:
        self._inflight = []


class _CollectorWeightClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over our collector actors (each forwards to its engine's
    workers with ``collective_rpc``). Replica ``i``'s worker joins the NCCL group at rank ``1 + i``."""

    def __init__(self, collectors: Sequence[Any]):
        self.collectors = list(collectors)

    def _all(self, method: str, *args, per_replica=None) -> None:
        import ray

        ray.get([c.engine_rpc.remote(method, *(per_replica(i) if per_replica else args))
                 for i, c in enumerate(self.collectors)])

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._all("init_weight_transfer_engine", per_replica=lambda i: ({**init_info, "rank_offset": 1 + i},))

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info) -> None:
        self._all("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_update")


class NCCLWeightSync:
    """GPU transport: NCCL broadcast with vLLM's ``NCCLTrainerWeightTransferEngine`` (untested here, no GPU).

    The engines must be built with ``weight_transfer_backend="nccl"``. The learner (rank 0 of the NCCL group)
    blocks until every engine worker has received the weights; the collectors take the broadcast between two
    generation calls.

    Args:
        model: the learner's model (on its GPU).
        collectors: collector actor handles, one engine worker each (tensor parallel size 1).
        master_address, master_port: TCP rendezvous for the NCCL group.
    """

    def __init__(self, model: torch.nn.Module, collectors: Sequence[Any], *, master_address: str, master_port: int):
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        from grpo_rl.lora import merged_state_dict

        class StateDictSource(WeightSource):
            """The HF-named state dict (LoRA adapters merged in), not vLLM's ``ModuleSource``
            (``named_parameters()``): a tied ``lm_head.weight`` must be sent under its own name too (see the
            module docstring), and a peft model's own names are not the engine's."""

            def metadata(self) -> list:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in merged_state_dict(model).items()]

            def __iter__(self):
                return iter(merged_state_dict(model).items())

        self.collectors = list(collectors)
        info = NCCLTrainerInitInfo(master_address=master_address, master_port=master_port,
                                   world_size=1 + len(self.collectors))
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=_CollectorWeightClient(self.collectors), source=StateDictSource())

    def push(self, learner) -> float:
        import ray

        t0 = time.perf_counter()
        self.engine.send_weights()
        ray.get([c.set_version.remote(learner.version) for c in self.collectors])
        return time.perf_counter() - t0

    def close(self) -> None:
        self.engine.shutdown()
