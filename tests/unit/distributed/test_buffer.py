"""The rollout buffer: FIFO, consumed once, bounded, with backpressure on the producer."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.distributed.buffer import FIFOSampler, RolloutBuffer


def batch(version: int, n: int = 4, tag: int = 0) -> TensorDict:
    return TensorDict({"tag": torch.full((n,), tag), "policy_version": torch.full((n,), version)}, batch_size=[n])


def test_fifo_order_and_each_entry_read_once():
    buf = RolloutBuffer(capacity=3)
    for tag in range(3):
        assert buf.put(batch(0, tag=tag), timeout=0)
    tags = [int(buf.take(0, timeout=0).batch["tag"][0]) for _ in range(3)]
    assert tags == [0, 1, 2]
    assert len(buf) == 0
    assert buf.take(0, timeout=0.01).batch is None  # nothing is read twice


def test_put_blocks_when_full_and_never_overwrites_unread():
    buf = RolloutBuffer(capacity=2)
    assert buf.put(batch(0, tag=0), timeout=0) and buf.put(batch(0, tag=1), timeout=0)
    assert not buf.put(batch(0, tag=2), timeout=0.05)  # full: refused after the timeout
    assert int(buf.take(0, timeout=0).batch["tag"][0]) == 0
    assert buf.put(batch(0, tag=2), timeout=0)  # the read slot is reused ...
    assert [int(buf.take(0, timeout=0).batch["tag"][0]) for _ in range(2)] == [1, 2]  # ... unread 1 survived


def test_slow_learner_never_lets_the_buffer_exceed_capacity():
    """A producer 20x faster than the consumer: it waits, the fill stays <= capacity, nothing is lost."""
    capacity, total = 2, 12
    buf = RolloutBuffer(capacity=capacity)
    fills = []

    def produce():
        for tag in range(total):
            assert buf.put(batch(0, tag=tag))
            fills.append(len(buf))

    producer = threading.Thread(target=produce)
    producer.start()
    seen = []
    for _ in range(total):
        time.sleep(0.02)  # the slow learner
        fills.append(len(buf))
        seen.append(int(buf.take(0, timeout=5).batch["tag"][0]))
    producer.join(timeout=5)
    stats = buf.stats()
    assert seen == list(range(total))
    assert max(fills) <= capacity and stats["max_fill"] <= capacity
    assert stats["put_wait_seconds"] > 0.1  # the producer was held back, not buffered without bound


def test_close_wakes_blocked_callers():
    buf = RolloutBuffer(capacity=1)
    buf.put(batch(0))
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("put", buf.put(batch(0))))
    t.start()
    time.sleep(0.05)
    buf.close()
    t.join(timeout=2)
    assert results["put"] is False and buf.is_closed()
    assert buf.take(0, timeout=0).batch is not None  # what was buffered can still be drained
    assert buf.take(0).batch is None  # closed and empty: returns at once instead of blocking


def test_fifo_sampler_rejects_overdraw():
    sampler = FIFOSampler()
    sampler.extend(torch.tensor([3, 4]))
    assert sampler.sample(None, 2)[0].tolist() == [3, 4]
    with pytest.raises(RuntimeError, match="unread"):
        sampler.sample(None, 1)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        RolloutBuffer(capacity=0)


def test_reports_ride_with_the_batches_and_failures_are_handed_over_once():
    buf = RolloutBuffer(capacity=2, name="scored")
    assert buf.put(batch(0, tag=0), reports={"collector/0": {"samples": 4}}, failure_examples=[{"error": "a"}])
    assert buf.put(batch(0, tag=1), reports={"collector/1": {"samples": 2}}, failure_examples=[{"error": "b"}])
    assert not buf.put(
        batch(0, tag=2), timeout=0.01, reports={"collector/0": {"samples": 99}}, failure_examples=[{"error": "lost"}]
    )  # full: a put that fails keeps nothing
    first = buf.take(0, timeout=0)
    assert first.reports["collector/0"] == {"samples": 4} and first.reports["collector/1"] == {"samples": 2}
    assert first.reports["scored"]["takes"] == 1 and first.reports["scored"]["size"] == 1
    assert [e["error"] for e in first.failure_examples] == ["a", "b"]
    assert buf.put(batch(0, tag=2), reports={"collector/0": {"samples": 12}})  # the newest report of a producer wins
    second = buf.take(0, timeout=0)
    assert second.reports["collector/0"] == {"samples": 12} and second.failure_examples == []
    assert int(buf.take(0, timeout=0).batch["tag"][0]) == 2
    none = buf.take(0, timeout=0.01)
    assert none.batch is None and none.reports == {} and none.failure_examples == []


def group(g: int, rewards=(0.0, 1.0), version: int = 0, answer_len: int = 2) -> TensorDict:
    """Group ``g`` of the stream: one answer per reward, ``answer_len`` tokens each."""
    n = len(rewards)
    return TensorDict(
        {
            "group_index": torch.full((n,), g),
            "group_id": torch.zeros(n, dtype=torch.long),
            "policy_version": torch.full((n,), version),
            "reward": torch.tensor(rewards),
            "response_ids": torch.ones(n, answer_len, dtype=torch.long),
        },
        batch_size=[n],
    )


def test_a_take_gathers_groups_in_arrival_order_across_calls():
    buf = RolloutBuffer(capacity=4, max_staleness=1, groups_per_batch=2)
    assert buf.put(group(2, answer_len=3), timeout=0)  # a later group finished first
    first = buf.take(0, timeout=0, groups=2)
    assert first.batch is None and first.consumed == [] and len(buf) == 0  # kept for the next call
    assert buf.put(group(0), timeout=0)
    result = buf.take(0, timeout=0, groups=2)
    assert result.consumed == [2, 0] and result.batch["group_index"].tolist() == [2, 2, 0, 0]
    assert result.batch["group_id"].tolist() == [0, 0, 1, 1] and result.batch["response_ids"].shape == (4, 3)


def test_a_gathered_group_that_went_stale_while_the_take_waited_is_dropped_and_consumed():
    buf = RolloutBuffer(capacity=4, max_staleness=1, groups_per_batch=2)
    assert buf.put(group(0, version=0), timeout=0) and buf.take(0, timeout=0, groups=2).batch is None
    assert buf.put(group(1, version=2), timeout=0) and buf.put(group(2, version=2), timeout=0)
    result = buf.take(2, timeout=0, groups=2)  # the learner moved on (a restart): group 0 is 2 versions old
    assert result.dropped == 2 and result.consumed == [0, 1, 2]
    assert result.batch["group_index"].tolist() == [1, 1, 2, 2]


def test_dynamic_sampling_drops_a_flat_group_at_its_put_and_frees_its_admission():
    buf = RolloutBuffer(capacity=4, max_staleness=1, admit_staleness=0, groups_per_batch=1, drop_flat=True)
    assert buf.admit(0, engine_version=0, timeout=0)
    assert not buf.admit(1, engine_version=0, timeout=0)  # bound 0: one group pending at a time
    assert buf.put(group(0, rewards=(1.0, 1.0)), timeout=0) and len(buf) == 0
    assert buf.admit(1, engine_version=0, timeout=0)  # the flat group no longer holds a place
    assert buf.put(group(1), timeout=0)
    result = buf.take(0, timeout=0, groups=1)
    assert result.batch["group_index"].tolist() == [1, 1] and result.consumed == [0, 1] and result.varied == 1
    assert [int(f["group_index"][0]) for f in result.flat] == [0] and buf.stats()["flat_groups"] == 1


def test_with_no_varied_group_within_max_draws_the_first_flat_ones_are_handed_over_once():
    buf = RolloutBuffer(capacity=4, groups_per_batch=2, drop_flat=True)
    for g in range(3):
        assert buf.put(group(g, rewards=(0.0, 0.0)), timeout=0)
    result = buf.take(0, timeout=0, groups=2, max_draws=3)
    assert result.varied == 0 and result.batch["group_index"].tolist() == [0, 0, 1, 1]
    assert result.consumed == [0, 1, 2] and len(result.flat) == 3
    assert buf.take(0, timeout=0, groups=2, max_draws=3).consumed == []  # nothing is handed over twice


def test_flat_groups_dropped_upstream_travel_with_their_batch_and_are_consumed_with_it():
    scored = RolloutBuffer(capacity=1, max_staleness=1)
    batch_of_two = TensorDict.cat([group(1), group(3)])  # a scored batch, as the reference stage puts it
    batch_of_two["group_id"] = torch.tensor([0, 0, 1, 1])
    assert scored.put(batch_of_two, timeout=0, flat=[group(2, rewards=(1.0, 1.0))])
    result = scored.take(0, timeout=0)
    assert result.consumed == [1, 3, 2] and [int(f["group_index"][0]) for f in result.flat] == [2]
