"""More groups in flight than the engine runs at once (``pipeline.groups_in_flight``): those beyond its places wait
inside it and start as answers end. The run, stopped and resumed, still trains every group of the stream once,
within the staleness bound, nothing dropped. The timed stand-ins of ``simulate.enabled`` generate (the simulated
engine queues answers as vLLM's scheduler does); the orchestration is the real one."""

from __future__ import annotations

import pytest

from tests.integration.helpers import read_metrics
from tests.integration.test_healing import assert_trained_exactly_once, finish, simulated, start

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_groups_queued_in_the_engine_are_trained_once_within_the_bound_across_a_resume(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "deep"
    extra = {
        "inference_model.num_devices": 2,
        "pipeline.groups_in_flight": 6,  # the engine runs 2 x 4 answers at once: 2 groups, 4 more waiting
        "pipeline.inflight_updates": "true",
        "pipeline.max_staleness": 4,
        "simulate.long_tail": 2.0,
        "simulate.answer_tokens": 64,
        "sampling.max_new_tokens": 64,
        "train.checkpoint_frequency": 2,
    }
    first = start("grpo-async.py", simulated(tiny_model_dir, run_dir, steps=4, **extra))
    out = finish(first)
    assert first.returncode == 0, out[-4000:]
    overrides = simulated(tiny_model_dir, run_dir, steps=8, resume="auto", **extra)
    resumed = start("grpo-async.py", overrides)
    out = finish(resumed)
    assert resumed.returncode == 0, out[-4000:]
    assert "resumed from" in out
    assert_trained_exactly_once(run_dir, overrides, steps=8)
    rows = read_metrics(run_dir)
    assert [r["dropped_samples"] for r in rows] == [0] * 8
    assert all(r["staleness_max"] <= 4 for r in rows), [r["staleness_max"] for r in rows]
