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
