"""Fully sharded data parallelism for the learner's policy with torch's FSDP2 (``fully_shard``).

Zhao et al., 2023, "PyTorch FSDP", in its per-parameter DTensor form (FSDP2). Each rank keeps a dim-0 shard of
every parameter, gradient and AdamW moment instead of a full replica (:mod:`grpo_rl.distributed.data_parallel`).
The units: one per decoder layer, then the root (the causal LM itself), which holds the tied
``embed_tokens``/``lm_head`` weight, the final norm and everything else outside the layers. A layer's weights
are all-gathered just before it runs and freed after it (``reshard_after_forward``), again for its backward,
and its gradient is reduce-scattered as soon as its backward is done.

Departures from the usual ``fully_shard(model); model(...)``:

* The learner never calls the root's ``forward``: :func:`grpo_rl.model.logprobs.sequence_logprobs` calls the decoder
  and then uses the LM head's weight directly (chunked log-softmax). FSDP's root hooks sit on ``forward``, so
  the embedding would meet its weight still sharded ("aten.embedding.default got mixed torch.Tensor and
  DTensor") and the first layer would take itself for the root. :func:`shard_model` therefore registers the
  root's own FSDP forward hooks on the decoder too: calling the decoder all-gathers the root's weights and runs
  FSDP's once-per-iteration root setup and, as FSDP does for a root, leaves them gathered until the end of
  backward, so the LM head's weight is the full tensor and the root's gradients are reduce-scattered by FSDP's
  end-of-backward callback. A call of the whole model still works (the second pass through the hooks finds
  everything gathered). The hooks are FSDP's private ``_pre_forward``/``_post_forward``, the ones the public
  :func:`~torch.distributed.fsdp.register_fsdp_forward_method` wraps around a method of the FSDP module itself;
  torch 2.13 has no public way to put them on a submodule (grouping ``fully_shard([decoder, lm_head])`` fails:
  a root must be one module, and ``lm_head``'s forward never runs).
* Gradients are summed over ranks, not averaged: the learner scales each micro-batch's loss by its share of the
  whole batch over all ranks, so per-rank gradients are partial sums (as for ``GradientAllReduce``). Every unit
  reduce-scatters with divide factor 1 and sum-only collectives (a plain ``ReduceOp.SUM``; FSDP's default is
  ``AVG``, and a custom factor alone would use ``PREMUL_SUM``, which gloo lacks), so :class:`ShardedDataParallel`
  has nothing left to reduce.
* Gradients are reduce-scattered after every micro-batch's backward and accumulate in the sharded ``.grad``.
  Reducing only after the last micro-batch (``set_requires_gradient_sync``) would keep full unsharded gradients
  between micro-batches and needs the learner to say which one is last; the price of reducing each time is one
  reduce-scatter of the gradients per micro-batch instead of one per optimizer step.
* Every forward and backward holds collectives, so every rank must run the same number of them: the learner
  pads a rank with fewer micro-batches with zero-weighted passes, and does not stop early at a non-finite loss
  (:class:`grpo_rl.training.learner.Learner`).

Full (unsharded) weights and optimizer state, for weight pushes, exports and checkpoints, go through
:mod:`torch.distributed.checkpoint.state_dict`: gathered to the CPU of rank 0 only (every rank must call, as the
gathers are collectives), and loaded by broadcasting from rank 0. LoRA models are not sharded: their trainable
state is a few MB, and :class:`~grpo_rl.distributed.data_parallel.GradientAllReduce` suits them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from grpo_rl.distributed.data_parallel import GradientAllReduce
from grpo_rl.model.lora import is_lora

GATHER_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Gather full tensors to the CPU of rank 0; the other ranks get an empty state."""

BROADCAST_FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
"""Load a full state held by rank 0 (the other ranks pass an empty one) into every rank's shards."""


def _default_mesh(model: torch.nn.Module) -> DeviceMesh:
    """A 1-D mesh over the default process group, on the device type the model's parameters are on."""
    device = next(model.parameters()).device
    backend = str(dist.get_backend())
    if device.type == "cpu" and "gloo" not in backend:
        raise ValueError(f"the model is on the CPU, but the process group's backend ({backend}) has no gloo")
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard_model(
    model: torch.nn.Module, *, mesh: DeviceMesh | None = None, reshard_after_forward: bool = True
) -> torch.nn.Module:
    """Shard the HF causal LM ``model`` (not a LoRA model), already on its device, in place over ``mesh``: one FSDP
    unit per decoder layer, then the root; returns it, now an :class:`~torch.distributed.fsdp.FSDPModule`.

    Call it after ``init_process_group`` and before building the :class:`~grpo_rl.training.learner.Learner`, whose
    optimizer must see the sharded parameters.

    Args:
        mesh: a 1-D data-parallel mesh (default: the whole default process group, on the model's device type).
        reshard_after_forward: free each layer's gathered weights after its forward and gather them again in
            backward (less memory); False keeps them until backward (less communication). The root always
            keeps its weights until backward.
    """
    if is_lora(model):
        raise ValueError("shard_model does not shard LoRA models; use GradientAllReduce data parallelism")
    mesh = mesh if mesh is not None else _default_mesh(model)
    decoder = model.get_decoder()
    for layer in decoder.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)  # reshard_after_forward=None: FSDP keeps the root gathered until backward
    state = model._get_fsdp_state()
    decoder.register_forward_pre_hook(state._pre_forward, prepend=True, with_kwargs=True)
    decoder.register_forward_hook(state._post_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # sum over ranks: with factor 1 and sum-only comms the reduce-scatter is a plain ReduceOp.SUM
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


class ShardedDataParallel(GradientAllReduce):
    """The learner's collectives for a model sharded by :func:`shard_model` over ``group`` (default: the world);
    as ``GradientAllReduce``, except that FSDP's reduce-scatter already summed the gradients."""

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Nothing to do: each rank's ``.grad`` is already its shard of the sum over ranks."""


def full_named_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The full weights in HF naming, on rank 0's CPU (an empty list on the other ranks); every rank must call."""
    # tied weights under every name, as in model.state_dict(), so a receiver loading by name finds both
    return list(get_model_state_dict(model, options=GATHER_TO_RANK0).items())


def load_full_model_state(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load full HF-named weights into a sharded model; only rank 0's ``state_dict`` is read (others pass ``{}``)."""
    set_model_state_dict(model, state_dict, options=BROADCAST_FROM_RANK0)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter name, on rank 0's CPU (``{}`` elsewhere), sharing no tensor
    with the optimizer; every rank must call."""
    state = get_optimizer_state_dict(model, optimizer, options=GATHER_TO_RANK0)
    # DCP gathers DTensors into new tensors but hands back plain CPU tensors (AdamW's ``step``) as they are: a
    # learner loaded from this state would otherwise share its step counters with this one.
    plain = {id(v) for s in optimizer.state.values() for v in s.values() if type(v) is torch.Tensor}
    for entry in state.get("state", {}).values():
        for key, value in entry.items():
            if id(value) in plain:
                entry[key] = value.clone()
    return state


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a :func:`full_optimizer_state` into a sharded model's optimizer; only rank 0's ``state`` is read."""
    set_optimizer_state_dict(model, optimizer, state, options=BROADCAST_FROM_RANK0)
