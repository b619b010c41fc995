"""Data parallelism for the learner: each rank takes a shard of the batch, gradients are summed over ranks.

The learner scales each micro-batch's loss by its share of the *whole* batch (tokens for ``token_mean``,
rows otherwise, see :mod:`grpo_rl.training.learner`). With the totals summed over ranks first, the per-rank gradients
are partial sums of the single-process gradient, so summing them (``all_reduce(SUM)``, not averaging) gives
exactly the update one process makes on the whole batch, up to float summation order
(``tests/integration/test_data_parallel.py``). Gradient clipping and the optimizer step then run on
identical gradients on every rank, so the replicas stay identical without a parameter broadcast.

Why not ``DistributedDataParallel``: the forward goes through the decoder and the LM head separately
(:mod:`grpo_rl.model.logprobs`), around DDP's ``forward`` hook, and gradient accumulation over micro-batches of
different sizes needs the sum, not DDP's mean. One flat all-reduce per optimizer step is all it would add.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from tensordict import TensorDict

from grpo_rl.model.packing import group_spans


class GradientAllReduce:
    """Collectives the learner calls once per optimizer step over ``group`` (default: the world); all ranks must
    call them in the same order."""

    def __init__(self, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def _device(self) -> torch.device:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(self.group) == "nccl"
            else torch.device("cpu")
        )

    def sum_scalars(self, values: Sequence[float]) -> list[float]:
        t = torch.tensor(list(values), dtype=torch.float64, device=self._device())
        dist.all_reduce(t, group=self.group)
        return t.tolist()

    def all_finite(self, finite: bool) -> bool:
        """True only if the step is finite on every rank (one bad rank makes all skip the step)."""
        t = torch.tensor([1 if finite else 0], dtype=torch.int32, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return bool(t.item())

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each gradient by its sum over ranks (a rank whose shard never touched a parameter adds 0)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def sum_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Sum share-weighted diagnostics over ranks (keys may differ: an empty shard reports none)."""
        gathered: list[dict[str, float]] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, sums, group=self.group)
        out: dict[str, float] = {}
        for part in gathered:
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v
        return out


def shard_batch(batch: TensorDict, num_shards: int) -> list[TensorDict]:
    """Cut ``batch`` into ``num_shards`` consecutive pieces of whole groups with about equal rows; a shard is empty
    only when there are fewer rows than shards."""
    n = batch.batch_size[0]
    spans = group_spans(batch["group_id"]) if n else []
    if len(spans) < num_shards:  # rows split evenly instead (a partial group is still a group)
        bounds = [round(i * n / num_shards) for i in range(num_shards + 1)]
    else:  # a group stays on one rank, so shared-prompt packing keeps working
        ends = [end for _, end in spans]  # the row after each group
        bounds = [0]
        for k in range(1, num_shards):
            # a group boundary past the previous cut that leaves at least one group for each later shard
            allowed = [e for j, e in enumerate(ends) if e > bounds[-1] and len(ends) - 1 - j >= num_shards - k]
            bounds.append(min(allowed, key=lambda e: abs(e - k * n / num_shards)))
        bounds.append(n)
    return [batch[bounds[i] : bounds[i + 1]] for i in range(num_shards)]
