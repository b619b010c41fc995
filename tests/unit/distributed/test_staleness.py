"""The staleness gate: a group is trained on only while current - v <= max_staleness for every row's version v."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from grpo_rl.config.checks import validate_async
from grpo_rl.config.schema import GRPOConfig
from grpo_rl.distributed.buffer import RolloutBuffer
from grpo_rl.distributed.pipeline import staleness_metrics
from grpo_rl.errors import ConfigError
from grpo_rl.run.preflight import validate


def batch(versions: list[int], group_id: list[int] | None = None) -> TensorDict:
    """Rows of the given policy versions; without ``group_id`` each row is a group of its own."""
    n = len(versions)
    gid = torch.tensor(group_id) if group_id is not None else torch.arange(n)
    return TensorDict(
        {"row": torch.arange(n), "policy_version": torch.tensor(versions), "group_id": gid}, batch_size=[n]
    )


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
        buf.put(batch(torch.randint(0, 10, (8,)).tolist(), [0, 0, 1, 1, 2, 2, 3, 3]))
    current, trained, dropped = 10, 0, 0
    while len(buf):
        out = buf.take(current, timeout=0)
        dropped += out.dropped  # counted even when only stale entries were left
        if out.batch is None:
            break
        assert bool((current - out.batch["policy_version"] <= 3).all())
        rows_per_group = torch.bincount(out.batch["group_id"])
        assert set(rows_per_group[rows_per_group > 0].tolist()) == {2}  # whole groups only
        trained += out.batch.batch_size[0]
    assert trained > 0 and dropped > 0 and trained + dropped == 40 * 8  # each sample trained on or counted


def test_groups_pass_or_fail_whole_by_their_oldest_row():
    buf = RolloutBuffer(capacity=4, max_staleness=2)
    # current 4: group 10 ages [1, 1] kept; group 3 ages [1, 3, 1] (mixed versions) dropped whole although two
    # of its rows are fresh; group 7 ages [2, 2] kept at the boundary; group 0 age [4] dropped.
    buf.put(batch([3, 3, 3, 1, 3, 2, 2, 0], [10, 10, 3, 3, 3, 7, 7, 0]))
    out = buf.take(current_version=4, timeout=0)
    assert out.batch["row"].tolist() == [0, 1, 5, 6]
    assert out.batch["group_id"].tolist() == [10, 10, 7, 7]
    assert out.staleness.tolist() == [1, 1, 2, 2]
    assert out.dropped == 4 and buf.stats()["dropped_samples"] == 4


def test_interleaved_group_rows_are_gated_together():
    buf = RolloutBuffer(capacity=4, max_staleness=1)
    # Group 1 owns rows 0 and 2 (ages 0 and 2): both go; group 2 owns rows 1 and 3 (ages 1 and 0): both stay.
    buf.put(batch([5, 4, 3, 5], [1, 2, 1, 2]))
    out = buf.take(current_version=5, timeout=0)
    assert out.batch["row"].tolist() == [1, 3] and out.dropped == 2


def test_entry_whose_every_group_has_a_stale_row_is_skipped():
    buf = RolloutBuffer(capacity=4, max_staleness=1)
    buf.put(batch([5, 1, 1, 5], [0, 0, 1, 1]))  # each group has one fresh row and one stale row
    buf.put(batch([5, 5], [0, 0]))
    out = buf.take(current_version=5, timeout=0)
    assert out.batch["policy_version"].tolist() == [5, 5]
    assert out.dropped == 4 and len(buf) == 0


def test_gate_needs_group_id():
    buf = RolloutBuffer(capacity=2, max_staleness=1)
    with pytest.raises(ValueError, match="group_id"):
        buf.put(batch([0, 0]).exclude("group_id"))
    assert RolloutBuffer(capacity=2).put(batch([0, 0]).exclude("group_id"), timeout=0)  # no gate, no groups needed


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


def test_async_config_rejects_a_bound_below_the_updates_per_batch():
    cfg = _cfg(max_staleness=2)
    cfg.train.updates_per_batch = 3
    validate(cfg)  # the synchronous loop ignores the pipeline group
    with pytest.raises(ConfigError, match="train.updates_per_batch=3"):
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


def test_admission_holds_producers_to_what_can_still_be_trained_in_time():
    """At learner version V with P batches pending (the new one included), each is consumed within P takes, so at
    V + (P - 1) at the latest (one version per batch); admitted while that minus the oldest pending version <= 2."""
    buf = RolloutBuffer(capacity=8, max_staleness=2, admit_staleness=2)
    assert [buf.admit(b, 0, timeout=0) for b in range(3)] == [True, True, True]  # latest takes at 0, 1, 2
    assert not buf.admit(3, 0, timeout=0)  # a 4th pending batch: the last one taken at version 3
    buf.learner_progress(1, [0])  # batch 0 trained; batches 1 and 2 (version 0) pending
    assert not buf.admit(3, 1, timeout=0)  # newer weights do not help: 1 + 2 - 0 = 3 for a version-0 batch
    buf.learner_progress(2, [1])
    assert not buf.admit(3, 2, timeout=0)  # batch 2 (version 0) would be taken at 3 if batch 3 went first
    buf.learner_progress(3, [2])
    assert buf.admit(3, 3, timeout=0)  # nothing pending: 3 - 3 = 0


def test_a_batch_admitted_later_cannot_push_an_earlier_one_out_of_the_bound():
    """Two producers, bound 1: batch 1 finishes before batch 0. Admitting batch 2 with the newest weights would let
    it be taken before batch 0 too, which would then be trained at version 2, two versions after its own."""
    buf = RolloutBuffer(capacity=8, max_staleness=1, admit_staleness=1)
    assert buf.admit(0, 0, timeout=0) and buf.admit(1, 0, timeout=0)
    buf.learner_progress(1, [1])  # batch 1 came first and was trained
    assert not buf.admit(2, 1, timeout=0)  # 1 + 1 - 0 = 2: batch 0 could go stale
    buf.learner_progress(2, [0])  # batch 0 trained at version 1, within the bound
    assert buf.admit(2, 2, timeout=0)


def test_admission_counts_versions_per_batch_and_can_be_off():
    buf = RolloutBuffer(capacity=8, admit_staleness=4, versions_per_batch=2)  # train.updates_per_batch=2
    assert [buf.admit(b, 0, timeout=0) for b in range(4)] == [True, True, True, False]  # latest 0, 2, 4, then 6
    assert all(RolloutBuffer(capacity=1).admit(b, 0, timeout=0) for b in range(5))  # no bound: every batch


def test_a_waiting_producer_is_admitted_when_the_learner_moves_on():
    import threading

    buf = RolloutBuffer(capacity=8, admit_staleness=0)
    assert buf.admit(0, 0, timeout=0) and not buf.admit(1, 0, timeout=0)
    admitted = []
    waiter = threading.Thread(target=lambda: admitted.append(buf.admit(1, 1, timeout=30)))
    waiter.start()
    buf.learner_progress(1, [0])  # batch 0 consumed, the learner at version 1: nothing pending, 1 - 1 = 0
    waiter.join(30)
    assert admitted == [True]
    buf.close()
    assert not buf.admit(2, 5, timeout=30)  # closed: no wait


def test_groups_generated_together_are_admitted_together_or_not_at_all():
    """A producer that held some groups of a batch while it waited for the rest could hold everyone back (each
    holds a part, none can start): a batch's groups are admitted in one call."""
    buf = RolloutBuffer(capacity=8, max_staleness=1, admit_staleness=1, groups_per_batch=2)
    buf.learner_progress(1)
    assert buf.admit([0, 1], engine_version=0, timeout=0)  # latest take 1 + 0, oldest 0: within 1
    assert not buf.admit([2, 3], engine_version=0, timeout=0)  # 4 pending: the second batch's take at 2, 2 - 0 > 1
    assert sorted(buf._pending) == [0, 1]  # nothing of the refused batch is held
    buf.learner_progress(2, [0, 1])
    assert buf.admit([2, 3], engine_version=1, timeout=0)
