"""Bounded rollout buffer between the collector(s) and the learner, with backpressure and a staleness gate.

The storage is torchrl's :class:`~torchrl.data.ReplayBuffer` over a :class:`~torchrl.data.ListStorage` of
``capacity`` entries. The unit is the group: a collector puts each group the moment its answers are scored (an entry
of ``G`` rows with its own padding, see :mod:`grpo_rl.rollout.collector`), and the learner takes the next
``groups`` of them in the order they arrived, from whichever collectors made them, joined into one batch
(:func:`~grpo_rl.engines.base.concat_batches`). The reference stage's buffer holds scored batches, one entry each.

* **FIFO, consumed once.** :class:`FIFOSampler` hands entries out in insertion order and forgets them. With
  torchrl's round-robin writer and at most ``capacity`` live entries, the slot a write lands in always holds
  an entry that was already consumed, so nothing unread is ever overwritten. A take that waits keeps the groups it
  has gathered (they are handed over with the rest, however many calls the wait takes).
* **Backpressure.** :meth:`RolloutBuffer.put` blocks while ``capacity`` entries wait to be read; memory is
  bounded by ``capacity`` entries however slow the learner is.
* **Staleness, enforced, per group.** A group is the rows of an entry that share a ``group_id`` (the one
  definition, see :mod:`grpo_rl.engines.base`); its age is that of its oldest row,
  ``current_version - min(policy_version)``. :meth:`RolloutBuffer.take` keeps a group only while its age is
  ``<= max_staleness`` and drops (and counts) every row of the others, so group advantages are never computed
  over part of a group. Oldest-first reading keeps drops to a minimum.
* **Dynamic sampling** (``drop_flat``): a group whose rewards are all equal is dropped when it is put, its admission
  released at once (so its collector starts another prompt), and handed to the next take with the step's groups
  (:attr:`TakeResult.flat`, for the step's reward statistics); a take returns early, with what it has, once
  ``max_draws`` groups were drawn for it (:mod:`grpo_rl.rollout.dynamic_sampling`).

* **Admission: nothing generated to be thrown away.** With ``admit_staleness`` set, a producer asks
  :meth:`RolloutBuffer.admit` before it starts a group, and waits until every group it would then have pending is
  sure to be fresh when the learner takes it. At learner version ``V``, with ``Q`` groups admitted and not yet
  consumed, the new one included, ``P`` groups per batch and ``E`` versions per consumed batch, each of them is
  consumed within the next ``ceil(Q / P)`` takes, so at version ``V + (ceil(Q / P) - 1) * E`` at the latest, in
  whatever order the producers finish; a group is admitted only while that minus the oldest engine version among
  them is within the bound. This is AReaL's capacity rule (Fu et al., 2025, "AReaL: A Large-Scale Asynchronous
  Reinforcement Learning System for Language Reasoning", section 5.1), counted in groups, and made safe against
  producers that finish out of order (a group admitted later but done first is taken first). The learner reports
  the version of its next take (one batch's versions ahead once it was handed a batch to train) and the groups it
  consumed through :meth:`RolloutBuffer.learner_progress`. The gate in :meth:`~RolloutBuffer.take` stays: it is
  what guarantees the bound (a push that lands after a group was admitted only makes it fresher), the admission
  keeps it from having to drop. With nothing pending, ``V - v`` is at most ``pipeline.push_every - 1 <=
  max_staleness``, so a producer is never held forever.

* **Reports ride along.** A :meth:`~RolloutBuffer.put` may carry its producer's counters (``reports``, the newest
  per producer wins) and failing reward calls (``failure_examples``); each :meth:`~RolloutBuffer.take` that returns
  a batch hands them over with the buffer's own counters. The learner learns how its producers are doing from the
  one call it makes per step anyway, however many producers there are.

It is thread-safe and blocking, so it can sit in a threaded Ray actor (:mod:`grpo_rl.distributed.actors`)
or be used directly in one process.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import ListStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler

from grpo_rl.engines.base import concat_batches, split_groups
from grpo_rl.rollout.dynamic_sampling import varied_groups


class FIFOSampler(Sampler):
    """Yields storage indices in insertion order, each exactly once."""

    def __init__(self):
        self._live: deque[int] = deque()

    def add(self, index: int) -> None:
        self._live.append(int(index))

    def extend(self, index: torch.Tensor) -> None:
        self._live.extend(int(i) for i in torch.as_tensor(index).reshape(-1))

    def sample(self, storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        if len(self._live) < batch_size:
            raise RuntimeError(f"FIFOSampler: {batch_size} entries asked, {len(self._live)} unread")
        return torch.tensor([self._live.popleft() for _ in range(batch_size)]), {}

    def _sampleable_count(self, storage, batch_size: int) -> int:
        return len(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def _empty(self) -> None:
        self._live.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"live": list(self._live)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._live = deque(state_dict["live"])

    def dumps(self, path) -> None:
        raise NotImplementedError("rollouts are not checkpointed: they are regenerated after a resume")

    def loads(self, path) -> None:
        raise NotImplementedError("rollouts are not checkpointed: they are regenerated after a resume")


@dataclass
class TakeResult:
    """What :meth:`RolloutBuffer.take` returns.

    Attributes:
        batch: the fresh groups handed over, joined (``None`` when the buffer was closed or the wait timed out).
        staleness: ``[n]`` ``current_version - policy_version`` of each returned sample.
        dropped: samples (rows of whole groups) dropped as too stale during this call.
        consumed: the ``group_index`` of every group this call handed over or dropped (entries that carry one).
        reports: with a batch, the newest counters of every producer (``{producer: {counter: value}}``) and this
            buffer's own :meth:`RolloutBuffer.stats` under its ``name``; empty otherwise.
        failure_examples: with a batch, the failing reward calls put since the last batch was taken.
        flat: with a batch, the groups dynamic sampling dropped since the last batch (``drop_flat``); when
            ``max_draws`` was reached without a varied group, ``batch`` is the first of them.
        varied: with a batch, how many of its groups vary (all of them, unless ``batch`` is the flat fallback).
    """

    batch: TensorDict | None
    staleness: torch.Tensor
    dropped: int
    wait_seconds: float
    consumed: list = field(default_factory=list)
    reports: dict = field(default_factory=dict)
    failure_examples: list = field(default_factory=list)
    flat: list = field(default_factory=list)
    varied: int = 0


class RolloutBuffer:
    """A bounded FIFO of collected groups (or batches) with backpressure and a staleness gate.

    Args:
        capacity: unread entries held at most; :meth:`put` blocks beyond that.
        max_staleness: a group is used only while ``current_version - policy_version <= max_staleness`` for
            every one of its rows; ``None`` disables the gate. With the gate on, entries need ``group_id``.
        name: the key of this buffer's own counters in :attr:`TakeResult.reports`.
        admit_staleness: the staleness bound :meth:`admit` holds producers to; ``None``: every group is admitted.
        versions_per_batch: policy versions the learner advances per batch it consumes (``train.updates_per_batch``).
        groups_per_batch: groups the learner takes per batch (``env.prompts_per_step``), for the admission rule.
        drop_flat: dynamic sampling: drop groups whose rewards are all equal when they are put (module docstring).
        pad_id: the token id that pads the groups joined into one batch.
    """

    def __init__(
        self,
        capacity: int,
        max_staleness: int | None = None,
        name: str = "buffer",
        *,
        admit_staleness: int | None = None,
        versions_per_batch: int = 1,
        groups_per_batch: int = 1,
        drop_flat: bool = False,
        pad_id: int = 0,
    ):
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be >= 1")
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.name = name
        self.drop_flat, self.pad_id = drop_flat, pad_id
        self._reports: dict[str, dict] = {}
        self._failure_examples: list[dict] = []
        self._sampler = FIFOSampler()
        self._rb = ReplayBuffer(
            storage=ListStorage(max_size=capacity),
            sampler=self._sampler,
            collate_fn=lambda entries: entries,
            batch_size=1,
        )
        self._cond = threading.Condition()
        self._closed = False
        self.admit_staleness, self.versions_per_batch = admit_staleness, versions_per_batch
        self.groups_per_batch = groups_per_batch
        self._pending: dict[int, int] = {}  # admitted group index -> engine version, until the learner consumes it
        self._delivered: set[int] = set()  # group indices put, from _delivered_floor on (the rest were consumed)
        self._delivered_floor = 0
        self._learner_version = 0
        self._gathered: list[TensorDict] = []  # fresh entries popped by a take that is still waiting for more
        self._flat: list[TensorDict] = []  # flat groups dropped since the last batch handed over (drop_flat)
        self._flat_consumed: list[int] = []  # ... and their indices, reported as consumed by the next take
        self._entry_flat: deque[list[TensorDict]] = deque()  # the flat groups put with each stored entry, in order
        self._stats = {
            "puts": 0,
            "takes": 0,
            "put_samples": 0,
            "taken_samples": 0,
            "dropped_samples": 0,
            "flat_groups": 0,
            "put_wait_seconds": 0.0,
            "take_wait_seconds": 0.0,
            "max_fill": 0,
            "duplicates_dropped": 0,
        }

    def __len__(self) -> int:
        return len(self._sampler)

    def put(
        self,
        batch: TensorDict,
        timeout: float | None = None,
        reports: dict[str, dict] | None = None,
        failure_examples: list[dict] | None = None,
        flat: list[TensorDict] = (),
    ) -> bool:
        """Append ``batch`` (a group, or a batch of them) with its ``reports`` (``{producer: counters}``),
        ``failure_examples`` and the ``flat`` groups dropped for it upstream (handed over with it), waiting while the
        buffer is full; False if closed or timed out first (then nothing is kept: a retried put carries them
        again)."""
        if self.max_staleness is not None and "group_id" not in batch.keys():
            raise ValueError("the staleness gate keeps or drops whole groups: the batch needs a 'group_id' [N]")
        t0 = time.perf_counter()
        with self._cond:
            ok = self._cond.wait_for(lambda: self._closed or len(self._sampler) < self.capacity, timeout)
            self._stats["put_wait_seconds"] += time.perf_counter() - t0
            if self._closed or not ok:
                return False
            indices = set(batch["group_index"].unique().tolist()) if "group_index" in batch.keys() else set()
            if any(g in self._delivered or g < self._delivered_floor for g in indices):
                # a lost producer's put that landed after its replacement had made the group again: the first one
                # stays, so no group is trained twice
                self._stats["duplicates_dropped"] += 1
                return True
            self._delivered.update(indices)
            self._reports.update(reports or {})
            self._failure_examples.extend(failure_examples or ())
            self._stats["puts"] += 1
            self._stats["put_samples"] += batch.batch_size[0]
            if self.drop_flat:
                batch = self._drop_flat(batch)
            if batch.batch_size[0]:
                self._rb.extend([batch])  # a list is a stack of entries: the batch stays one entry
                self._entry_flat.append(list(flat))
            else:
                self._flat.extend(flat)
            self._stats["max_fill"] = max(self._stats["max_fill"], len(self._sampler))
            self._cond.notify_all()
        return True

    def _drop_flat(self, batch: TensorDict) -> TensorDict:
        """``batch`` without its flat groups, which are kept for the next take and whose admissions are released."""
        varied = varied_groups(batch)
        if bool(varied.all()):
            return batch
        for group in split_groups(batch[~varied]):
            self._flat.append(group)
            self._stats["flat_groups"] += 1
            if "group_index" in group.keys():
                g = int(group["group_index"][0])
                self._pending.pop(g, None)  # its producer may start another prompt at once
                self._flat_consumed.append(g)
        return batch[varied]

    def admit(self, index: int | list[int], engine_version: int, timeout: float | None = None) -> bool:
        """Wait until group ``index`` (or the groups ``index``, together), started now with the weights of
        ``engine_version``, can be admitted without any pending group going stale (module docstring); False if closed
        or timed out first (the caller loads newer weights, if any arrived, and asks again; ``timeout=0`` asks without
        waiting). Groups that are to be generated together are admitted together: a producer that held some while it
        waited for the rest could hold everyone back."""
        indices = [int(i) for i in (index if isinstance(index, list) else [index])]
        with self._cond:
            # A group admitted again was owed by a producer that was lost before it delivered: its replacement.
            if any([self._pending.pop(i, None) is not None for i in indices]):
                self._cond.notify_all()
            ok = self._cond.wait_for(lambda: self._closed or self._fits(engine_version, len(indices)), timeout)
            if self._closed or not ok:
                return False
            self._pending.update(dict.fromkeys(indices, engine_version))
            return True

    def _fits(self, engine_version: int, count: int = 1) -> bool:
        if self.admit_staleness is None:
            return True
        pending = len(self._pending) + count  # with the new groups
        oldest = min([engine_version, *self._pending.values()])
        takes = -(-pending // self.groups_per_batch)  # the takes within which all of them are consumed
        latest_take = self._learner_version + (takes - 1) * self.versions_per_batch
        return latest_take - oldest <= self.admit_staleness

    def learner_progress(self, version: int, consumed: list[int] = ()) -> None:
        """The learner's next take is at policy ``version`` (a batch it was just handed is trained first), and it
        consumed (trained on or dropped) the groups ``consumed``."""
        with self._cond:
            self._learner_version = version
            for index in consumed:
                self._pending.pop(int(index), None)
            self._cond.notify_all()

    def take(
        self, current_version: int, timeout: float | None = None, groups: int = 1, max_draws: int | None = None
    ) -> TakeResult:
        """Hand over the oldest entries until they hold ``groups`` fresh groups (an entry is never split); drop and
        count the samples of stale groups on the way. With ``drop_flat``, hand over what there is once
        ``max_draws`` groups were drawn for this batch, flat ones included."""
        t0 = time.perf_counter()
        deadline = None if timeout is None else t0 + timeout
        dropped, consumed = 0, []
        with self._cond:
            # what an earlier call gathered was fresh at its version: checked again at this one
            gathered, self._gathered = self._gathered, []
            for entry in gathered:
                dropped += self._gather(entry, current_version, consumed)
            while True:
                while len(self._sampler) and self._count(self._gathered) < groups:
                    entry = self._rb.sample(1)[0]
                    self._flat.extend(self._entry_flat.popleft())
                    dropped += self._gather(entry, current_version, consumed)
                    self._cond.notify_all()  # a slot is free: wake a waiting put
                consumed.extend(self._flat_consumed)
                self._flat_consumed = []
                kept = self._count(self._gathered)
                drawn = kept + len(self._flat)
                if kept >= groups or (max_draws is not None and drawn >= max_draws):
                    return self._hand_over(current_version, dropped, t0, consumed)
                remaining = None if deadline is None else max(0.0, deadline - time.perf_counter())
                ok = self._cond.wait_for(
                    lambda: self._closed or len(self._sampler) > 0 or len(self._flat_consumed) > 0, remaining
                )
                if not ok or (self._closed and len(self._sampler) == 0 and not self._flat_consumed):
                    if self._closed and self._gathered:  # drain: what was gathered is handed over
                        return self._hand_over(current_version, dropped, t0, consumed)
                    return self._finish(None, torch.zeros(0, dtype=torch.long), dropped, t0, consumed)

    @staticmethod
    def _count(entries: list[TensorDict]) -> int:
        return sum(len(torch.unique(e["group_id"])) if "group_id" in e.keys() else 1 for e in entries)

    def _gather(self, entry: TensorDict, current_version: int, consumed: list) -> int:
        """Keep ``entry``'s fresh groups for the take under way; returns the samples dropped as too stale."""
        age = current_version - entry["policy_version"]  # [N]
        keep = self._fresh_groups(age, entry)  # [N]
        if "group_index" in entry.keys():
            consumed.extend(sorted(set(entry["group_index"][~keep].tolist())))
        if bool(keep.any()):
            self._gathered.append(entry if bool(keep.all()) else entry[keep])
        return int((~keep).sum())

    def _hand_over(self, current_version: int, dropped: int, t0: float, consumed: list) -> TakeResult:
        entries, flat = self._gathered, self._flat
        self._gathered, self._flat = [], []
        varied = self._count(entries)
        for entry in entries:
            if "group_index" in entry.keys():
                consumed.extend(dict.fromkeys(entry["group_index"].tolist()))
        if not self.drop_flat:  # flat groups dropped upstream are consumed as they are handed over
            consumed.extend(int(g["group_index"][0]) for g in flat if "group_index" in g.keys())
        if not entries:  # max_draws reached with no varied group: the first flat ones (the update is skipped)
            entries = flat[: self.groups_per_batch]  # consumed as they were dropped
        consumed[:] = dict.fromkeys(consumed)
        batch = concat_batches(entries, self.pad_id)
        result = self._finish(batch, current_version - batch["policy_version"], dropped, t0, consumed)
        result.flat, result.varied = flat, varied
        return result

    def _fresh_groups(self, age: torch.Tensor, entry: TensorDict) -> torch.Tensor:
        """``[N]`` bool: True on every row of a group whose oldest row is within ``max_staleness`` (everywhere
        when the gate is off)."""
        if self.max_staleness is None or age.numel() == 0:
            return torch.ones_like(age, dtype=torch.bool)
        _, group_N = torch.unique(entry["group_id"], return_inverse=True)  # [N] dense group index
        oldest_K = age.new_zeros(int(group_N.max()) + 1).scatter_reduce(0, group_N, age, "amax", include_self=False)
        return oldest_K[group_N] <= self.max_staleness  # [N]

    def _finish(self, batch, age, dropped, t0, consumed) -> TakeResult:
        wait = time.perf_counter() - t0
        self._stats["take_wait_seconds"] += wait
        self._stats["dropped_samples"] += dropped
        result = TakeResult(batch=batch, staleness=age, dropped=dropped, wait_seconds=wait, consumed=consumed)
        if batch is not None:
            self._stats["takes"] += 1
            self._stats["taken_samples"] += batch.batch_size[0]
            result.reports = {**self._reports, self.name: self.stats()}
            result.failure_examples, self._failure_examples = self._failure_examples, []
        return result

    def reset(self) -> None:
        """Forget every entry, admission and delivered index (the stream is taken back to a checkpoint); the
        counters stay."""
        with self._cond:
            self._rb.empty()
            self._gathered, self._flat, self._flat_consumed = [], [], []
            self._entry_flat.clear()
            self._pending.clear()
            self._delivered.clear()
            self._delivered_floor = 0
            self._cond.notify_all()

    def delivered(self, above: int = 0) -> list[int]:
        """The group indices put so far that are ``>= above`` (handed over, waiting in this buffer, or dropped as
        flat)."""
        with self._cond:
            self._delivered_floor = max(self._delivered_floor, above)
            self._delivered = {b for b in self._delivered if b >= self._delivered_floor}
            return sorted(self._delivered)

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every waiter; later puts fail, takes drain what is left and then return nothing."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stats(self) -> dict[str, float]:
        """Counters since creation plus the current fill (unread entries / capacity)."""
        with self._cond:
            return {
                **self._stats,
                "size": len(self._sampler),
                "capacity": self.capacity,
                "fill": len(self._sampler) / self.capacity,
            }
