"""The staleness gate: a sample of version v is trained on only while current - v <= max_staleness."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from grpo_rl.buffer import RolloutBuffer
from grpo_rl.config import ConfigError, GRPOConfig, validate, validate_async
from grpo_rl.distributed.pipeline import staleness_metrics


def batch(versions: list[int]) -> TensorDict:
    n = len(versions)
    return TensorDict({"row": torch.arange(n), "policy_version": torch.tensor(versions)}, batch_size=[n])


def test_boundary_sample_is_kept_and_one_older_is_dropped():
    buf = RolloutBuffer(capacity=4, max_staleness=2)
    buf.put(batch([3, 2, 1, 3]))
    out = buf.take(current_version=4, timeout=0)
    assert out.batch["row"].tolist() == [0, 1, 3]  # ages 1, 2, 1 kept; age 3 dropped
    assert out.staleness.tolist() == [1, 2, 1]
    assert out.dropped == 1
    assert buf.stats()["dropped_samples"] == 1


def test_fully_stale_entries_are_skipped_and_counted():
    buf = RolloutBuffer(capacity=4, max_staleness=1)
    buf.put(batch([0, 0]))
    buf.put(batch([1, 1, 1]))
    buf.put(batch([5, 5]))
    out = buf.take(current_version=5, timeout=0)
    assert out.batch["policy_version"].tolist() == [5, 5]
    assert out.dropped == 5
    assert len(buf) == 0  # stale entries do not hold buffer space


def test_every_returned_sample_respects_the_bound():
    torch.manual_seed(0)
    buf = RolloutBuffer(capacity=64, max_staleness=3)
    for _ in range(40):
        buf.put(batch(torch.randint(0, 10, (8,)).tolist()))
    current, trained, dropped = 10, 0, 0
    while len(buf):
        out = buf.take(current, timeout=0)
        if out.batch is None:
            break
        assert bool((current - out.batch["policy_version"] <= 3).all())
        trained += out.batch.batch_size[0]
        dropped += out.dropped
    assert trained > 0 and dropped > 0 and trained + dropped == 40 * 8  # each sample trained on or counted


def test_no_gate_keeps_everything():
    buf = RolloutBuffer(capacity=2, max_staleness=None)
    buf.put(batch([0, 1]))
    assert buf.take(current_version=100, timeout=0).batch.batch_size[0] == 2


def test_staleness_metrics():
    buf = RolloutBuffer(capacity=2, max_staleness=2)
    buf.put(batch([4, 3, 2, 1]))
    m = staleness_metrics(buf.take(current_version=4, timeout=0))
    assert m["staleness_max"] == 2 and m["staleness_mean"] == pytest.approx(1.0) and m["dropped_samples"] == 1


def _cfg(**pipeline):
    cfg = OmegaConf.structured(GRPOConfig)
    for k, v in pipeline.items():
        cfg.pipeline[k] = v
    return cfg


def test_async_config_rejects_a_bound_below_the_epochs():
    cfg = _cfg(max_staleness=2)
    cfg.train.epochs = 3
    validate(cfg)  # the synchronous loop ignores the pipeline group
    with pytest.raises(ConfigError, match="train.epochs=3"):
        validate_async(cfg)
    cfg.pipeline.max_staleness = 3
    validate_async(cfg)


def test_config_rejects_a_bound_below_the_push_interval():
    validate(_cfg(max_staleness=1, push_every=2))  # the engine holds a version for push_every steps: age <= 1
    with pytest.raises(ConfigError, match="pipeline.max_staleness"):
        validate(_cfg(max_staleness=0, push_every=3))
    with pytest.raises(ConfigError, match="pipeline.buffer_capacity"):
        validate(_cfg(buffer_capacity=0))
    with pytest.raises(ConfigError, match="pipeline.weight_transport"):
        validate(_cfg(weight_transport="carrier_pigeon"))
