"""The asynchronous loop's bookkeeping, without Ray or an engine: rates over replicas, the NCCL update lock,
the resumed collection round."""
from __future__ import annotations

import threading

import pytest

from grpo_rl.distributed.actors import CollectorWorker
from grpo_rl.distributed.pipeline import step_rates


def _counters(**values) -> dict[str, float]:
    keys = ("samples", "tokens", "busy_seconds", "wait_for_space_seconds", "weight_load_seconds",
            "generation_seconds", "reward_seconds", "reward_failures")
    out = {f"collector/{k}": float(values.get(k, 0.0)) for k in keys}
    out.update({"collector/version": 3.0, "collector/replicas": float(values.get("replicas", 1))})
    out.update({f"buffer/{k}": 0.0 for k in ("fill", "size", "max_fill", "dropped_samples")})
    return out


def test_busy_fraction_is_per_replica():
    prev = _counters(replicas=2)
    now = _counters(replicas=2, samples=16, tokens=400, busy_seconds=3.0, generation_seconds=2.0, reward_failures=1)
    rates = step_rates(prev, now, seconds=2.0)
    assert rates["collector_busy_fraction"] == pytest.approx(0.75)  # 3 busy seconds over 2 replicas x 2 s
    assert rates["generation_seconds"] == pytest.approx(1.0)  # per replica, named as in the sync loop
    assert rates["collector_samples_per_second"] == pytest.approx(8.0)
    assert rates["reward_failures"] == 1


class _FakeLLM:
    def __init__(self):
        self.calls, self.resets = [], 0

    def collective_rpc(self, method, args=()):
        self.calls.append(method)
        if method == "boom":
            raise RuntimeError("worker failed")

    def reset_prefix_cache(self):
        self.resets += 1


def _worker() -> CollectorWorker:
    worker = object.__new__(CollectorWorker)  # the lock logic only: no engine, no environment
    worker.engine = type("Engine", (), {})()
    worker.engine.llm = _FakeLLM()
    worker._engine_lock = threading.Lock()
    worker._in_weight_update = False
    return worker


def test_engine_stays_locked_through_a_weight_update():
    worker = _worker()
    worker.engine_rpc("init_weight_transfer_engine", {})
    assert not worker._engine_lock.locked()  # a single call takes and releases the lock
    worker.engine_rpc("start_weight_update")
    assert worker._engine_lock.locked()  # generation (which takes the lock) must wait from here ...
    worker.engine_rpc("update_weights", {})
    assert worker._engine_lock.locked()
    worker.engine_rpc("finish_weight_update")
    assert not worker._engine_lock.locked()  # ... to here
    assert worker.engine.llm.resets == 1
    assert worker.engine.llm.calls == ["init_weight_transfer_engine", "start_weight_update", "update_weights",
                                       "finish_weight_update"]


def test_a_failed_weight_update_releases_the_engine():
    worker = _worker()
    worker.engine_rpc("start_weight_update")
    with pytest.raises(RuntimeError, match="worker failed"):
        worker.engine_rpc("boom")
    assert not worker._engine_lock.locked()


def test_resumed_data_position_sets_the_collection_round():
    class Env:
        def __init__(self):
            self.loaded, self.resets = None, 0

        def load_state_dict(self, state):
            self.loaded = state

        def reset(self):
            self.resets += 1

        def state_dict(self):
            return {"position": self.resets}

    worker = object.__new__(CollectorWorker)
    worker.collector = type("Collector", (), {})()
    worker.collector.env = Env()
    worker._engine_lock, worker.replica, worker._round = threading.Lock(), 1, None
    worker.load_env_state({"epoch": 0, "position": 8, "seed": 0, "collector_round": 5})
    assert worker._round == 5  # run() then goes on with round 5's prompts and seeds, not the learner's step
    assert worker.env_state()["collector_round"] == 5  # a checkpoint before the next batch keeps the round
    assert worker.collector.env.loaded["position"] == 8 and worker.collector.env.resets == 1  # replica 1 skips 1


def test_an_actor_context_places_the_reward_model_on_the_actors_device(tiny_model_dir, tmp_path):
    """Inside a collector actor nothing allocates devices again: the reward model gets the actor's device."""
    import torch

    from grpo_rl.distributed.actors import actor_run_context

    cfg = {"reward": {"model_path": str(tiny_model_dir)}}
    run = actor_run_context(cfg, str(tmp_path), str(tiny_model_dir), torch.device("cpu"))
    assert run.devices.reward_model == (torch.device("cpu"),)
    assert actor_run_context({}, str(tmp_path), str(tiny_model_dir), torch.device("cpu")).devices.reward_model == ()
