"""What healing rests on, without Ray: the restart budget and its record, and the buffer's side of exactly once
(a late put from a replaced producer is dropped, a replacement's admission takes its predecessor's place)."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from tensordict import TensorDict

from grpo_rl.distributed.actors import CollectorWorker
from grpo_rl.distributed.buffer import RolloutBuffer
from grpo_rl.distributed.healing import Restarts, died_how, record_pids


def indexed(index: int, version: int = 0, n: int = 2) -> TensorDict:
    """Group ``index`` of the stream, ``n`` answers."""
    return TensorDict(
        {
            "group_index": torch.full((n,), index),
            "policy_version": torch.full((n,), version),
            "group_id": torch.zeros(n, dtype=torch.long),
        },
        batch_size=[n],
    )


def test_restarts_are_counted_against_the_budget_logged_and_reported_once(tmp_path):
    book = Restarts(2, tmp_path)
    book.register("collector")
    assert book.metrics() == {"restarts/collector": 0.0, "restart_seconds": 0.0}
    assert book.allowed("collector")
    book.record("collector", 1, "died (its node died)", 3.5, pid=42)
    book.record("collector", 0, "died (its process was killed or crashed)", 1.5)
    assert not book.allowed("collector") and book.allowed("reference")
    assert "most pipeline.max_restarts=2" in book.exhausted("collector")
    metrics = book.metrics()
    assert metrics == {"restarts/collector": 2.0, "restart_seconds": 5.0}
    assert book.metrics()["restart_seconds"] == 0.0  # the seconds are those since the last report
    rows = [json.loads(line) for line in (tmp_path / "restarts.jsonl").read_text().splitlines()]
    assert [(r["role"], r["replica"], r["count"]) for r in rows] == [("collector", 1, 1), ("collector", 0, 2)]
    assert rows[0]["pid"] == 42 and rows[0]["cause"] == "died (its node died)"


def test_no_budget_ends_at_the_first_loss_and_nothing_replaceable_reports_nothing():
    book = Restarts(0)
    assert not book.allowed("collector") and "max_restarts=0" in book.exhausted("collector")
    assert book.metrics() == {}


def test_died_how_tells_a_lost_node_from_a_lost_process():
    assert died_how(RuntimeError("The actor is dead because its node has died. Node Id: ab")) == "its node died"
    assert died_how(RuntimeError("Worker unexpectedly exits with a connection error")) == (
        "its process was killed or crashed"
    )


def test_record_pids_keeps_the_other_roles(tmp_path):
    record_pids(tmp_path, "collector", [1, 2])
    record_pids(tmp_path, "learner", [3])
    record_pids(tmp_path, "collector", [1, 5])
    assert json.loads((tmp_path / "processes.json").read_text()) == {"collector": [1, 5], "learner": [3]}


def test_a_second_copy_of_a_group_is_dropped_even_after_it_was_consumed():
    buf = RolloutBuffer(capacity=4, max_staleness=2)
    assert buf.put(indexed(0), timeout=0) and buf.put(indexed(1), timeout=0)
    assert buf.put(indexed(1, version=1), timeout=0)  # a late put of a replaced producer: accepted, not stored
    assert len(buf) == 2 and buf.stats()["duplicates_dropped"] == 1
    assert buf.delivered() == [0, 1]
    assert buf.take(0, timeout=0).consumed == [0]
    assert buf.delivered(above=1) == [1]  # the learner's watermark passed 0
    assert buf.put(indexed(0), timeout=0) and len(buf) == 1  # below the watermark: still a duplicate
    assert buf.stats()["duplicates_dropped"] == 2


def test_a_replacement_takes_over_its_predecessors_admission():
    """A producer admitted for group 0 is lost; the admission it left behind must not hold its replacement back:
    admitting the same index again replaces it (with one pending group allowed, the second would wait forever)."""
    buf = RolloutBuffer(capacity=2, max_staleness=0, admit_staleness=0)
    assert buf.admit(0, engine_version=0, timeout=0)
    assert not buf.admit(1, engine_version=0, timeout=0.01)  # two pending at staleness 0: the second waits
    assert buf.admit(0, engine_version=0, timeout=0)  # the replacement's admission of the same batch


def test_reset_forgets_entries_admissions_and_deliveries():
    buf = RolloutBuffer(capacity=2, max_staleness=1, admit_staleness=1)
    assert buf.admit(0, 0, timeout=0) and buf.put(indexed(0), timeout=0)
    buf.reset()
    assert len(buf) == 0 and buf.delivered() == []
    assert buf.put(indexed(0), timeout=0) and len(buf) == 1  # the stream went back: group 0 is made again


def test_a_collector_whose_inflight_push_failed_raises_while_it_waits_for_admission():
    """A failed in-flight push leaves the collector's version behind the learner's, so the buffer may never admit it
    again: the wait for admission raises the push's error (the driver then replaces the collector) and does not ask
    the buffer."""

    class NoBuffer:
        def __getattr__(self, name):
            raise AssertionError(f"the buffer was asked ({name}) after the push had failed")

    worker = object.__new__(CollectorWorker)  # the loop's state alone: no engine, no Ray
    worker._stop, worker._push_error = threading.Event(), ConnectionError("engine server gone")
    worker.buffer = NoBuffer()
    with pytest.raises(ConnectionError, match="engine server gone"):
        worker._admitted(5)
