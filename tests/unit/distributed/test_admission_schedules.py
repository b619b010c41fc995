"""The buffer's admission (grpo_rl.distributed.buffer.RolloutBuffer.admit) over random schedules: 1 to 4 producers
that load pushes late and finish in any order, staleness bounds 0 to 2, 1 or 2 policy versions per batch, 1 to 3
groups per batch. Against the
real buffer, no sample is ever dropped as stale, every trained sample is within the bound, and nobody waits forever.

The schedule is a single thread that steps the roles as the asynchronous loop runs them
(grpo_rl.distributed.actors.CollectorWorker.run, grpo_rl.distributed.pipeline.AsyncRollouts.next_batch), each call
non-blocking (``timeout=0``), one at a time in a random order:

* a producer loads the newest push it was delivered, asks to be admitted for its next group (replica ``r`` of ``N``
  makes groups ``r, r + N, ...``), loads again, generates with the weights it then holds, and puts the group,
  retrying while the buffer is full;
* each push reaches each producer after its own delay (the object store's ``set_weights`` calls);
* the learner reports the version of its next take, takes (``P`` groups, gathered over as many calls as it takes),
  reports what it consumed, trains (``E`` versions) and pushes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from grpo_rl.distributed.buffer import RolloutBuffer

SCHEDULES = 300
STEPS = 8  # batches the learner trains per schedule
MAX_EVENTS = 4000  # far more than a schedule needs: reaching it means someone waits forever


@dataclass
class Producer:
    replica: int
    version: int = 0  # the weights its engine holds
    delivered: int | None = None  # the newest push that reached it, not loaded yet
    in_transit: list[int] = field(default_factory=list)  # pushes on their way to it
    index: int | None = None  # the group it asks admission for, or was admitted for
    admitted: bool = False
    made: TensorDict | None = None  # a group waiting for space

    def load(self) -> None:
        if self.delivered is not None:
            self.version, self.delivered = self.delivered, None


def rows(index: int, version: int) -> TensorDict:
    """Group ``index``, two answers, generated with the weights of ``version``."""
    return TensorDict(
        {
            "policy_version": torch.full((2,), version),
            "group_id": torch.zeros(2, dtype=torch.long),
            "group_index": torch.full((2,), index),
        },
        batch_size=[2],
    )


def run_schedule(seed: int) -> dict:
    """One random schedule; its settings and what happened."""
    rng = random.Random(seed)
    n, bound, per_batch, groups = rng.randint(1, 4), rng.randint(0, 2), rng.choice([1, 2]), rng.randint(1, 3)
    buffer = RolloutBuffer(
        capacity=rng.randint(1, 3) * groups,
        max_staleness=bound,
        admit_staleness=bound,
        versions_per_batch=per_batch,
        groups_per_batch=groups,
    )
    producers = [Producer(r, index=r) for r in range(n)]
    version, trained, training, dropped, staleness = 0, 0, False, 0, []

    def producer_step(p: Producer) -> None:
        if p.made is not None:  # waiting for space
            if buffer.put(p.made, timeout=0):
                p.made, p.index, p.admitted = None, p.index + n, False
        elif not p.admitted:
            p.load()
            p.admitted = buffer.admit(p.index, p.version, timeout=0)
        else:  # generate, with the newest weights it holds (a push that came after the admission too)
            p.load()
            p.made = rows(p.index, p.version)

    def learner_step() -> None:
        nonlocal version, trained, training, dropped
        if training:  # the update, then the push
            version, trained, training = version + per_batch, trained + 1, False
            for p in producers:
                p.in_transit.append(version)
            return
        buffer.learner_progress(version)
        result = buffer.take(version, timeout=0, groups=groups)
        dropped += result.dropped
        if result.consumed:
            buffer.learner_progress(version + (per_batch if result.batch is not None else 0), result.consumed)
        if result.batch is not None:
            staleness.extend(result.staleness.tolist())
            training = True

    events = 0
    while trained < STEPS and events < MAX_EVENTS:
        events += 1
        moves = [lambda p=p: producer_step(p) for p in producers] + [learner_step]
        for p in producers:
            if p.in_transit:

                def deliver(p=p):
                    p.delivered = max(p.delivered or 0, p.in_transit.pop(0))

                moves.append(deliver)
        rng.choice(moves)()
    return {
        "seed": seed,
        "producers": n,
        "bound": bound,
        "per_batch": per_batch,
        "groups": groups,
        "trained": trained,
        "dropped": dropped,
        "buffer_dropped": buffer.stats()["dropped_samples"],
        "staleness": staleness,
    }


def test_random_schedules_never_drop_and_stay_within_the_bound():
    runs = [run_schedule(seed) for seed in range(SCHEDULES)]
    stuck = [r["seed"] for r in runs if r["trained"] < STEPS]
    assert not stuck, f"schedules where the learner waited forever: {stuck[:10]}"
    dropping = [(r["seed"], r["producers"], r["bound"], r["per_batch"], r["dropped"]) for r in runs if r["dropped"]]
    assert not dropping, f"(seed, producers, bound, versions per batch, samples dropped): {dropping[:10]}"
    assert all(r["buffer_dropped"] == 0 for r in runs)
    assert all(0 <= s <= r["bound"] for r in runs for s in r["staleness"])
    # the schedules cover the settings, and batches were trained at the edge of the bound, not only fresh ones
    assert {(r["producers"], r["bound"], r["per_batch"]) for r in runs} == {
        (n, b, e) for n in range(1, 5) for b in range(3) for e in (1, 2)
    }
    assert {r["groups"] for r in runs} == {1, 2, 3}
    assert any(s == r["bound"] > 0 for r in runs for s in r["staleness"])
