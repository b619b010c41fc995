"""The wiring of roles, without Ray or an engine: placement, actor slices, the stream position that makes a resume
exactly-once, the replicas' share of the stream, and the asynchronous loop's rates."""

from __future__ import annotations

import itertools

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.distributed.pipeline import combine_reports, step_rates
from grpo_rl.placement.context import plan_placement
from grpo_rl.placement.devices import allocate_devices
from grpo_rl.rollout.source import InProcessRollouts, StreamPosition, owed_groups
from tests.unit.rollout.streams import CountingEnv, StreamingCollector


def _counters(**values) -> dict[str, float]:
    keys = (
        "samples",
        "tokens",
        "busy_seconds",
        "wait_for_space_seconds",
        "weight_load_seconds",
        "generation_seconds",
        "reward_seconds",
        "reward_failures",
    )
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


def test_collector_reports_combine_into_the_step_counters():
    """What the collectors' batches carried: counters summed over replicas, the oldest engine's version, the
    collectors' buffer's fill, and the drops of whichever buffer gates."""
    reports = {
        "collector/0": {"samples": 8, "busy_seconds": 2.0, "version": 3, "replica": 0},
        "collector/1": {"samples": 4, "busy_seconds": 1.0, "version": 2, "replica": 1},
        "buffer": {"fill": 0.5, "size": 1, "max_fill": 2, "dropped_samples": 0},
        "scored": {"fill": 1.0, "size": 1, "max_fill": 1, "dropped_samples": 6},
    }
    out = combine_reports(reports, num_collectors=2)
    assert out["collector/samples"] == 12 and out["collector/busy_seconds"] == 3.0
    assert out["collector/version"] == 2 and out["collector/replicas"] == 2
    assert out["buffer/fill"] == 0.5 and out["buffer/dropped_samples"] == 6
    assert out["collector/tokens"] == 0  # a counter nobody reported yet counts zero
    assert combine_reports({}, num_collectors=3)["collector/version"] == 0  # before the first batch
    rates = step_rates(combine_reports({}, 2), out, seconds=1.0)
    assert rates["collector_samples_per_second"] == 12 and rates["dropped_samples_total"] == 6


def _cfg(**overrides):
    return OmegaConf.merge(
        OmegaConf.structured(GRPOConfig), OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()])
    )


def _placement(mode: str, cores: int = 2, num_gpus: int = 0, **overrides):
    cfg = _cfg(**overrides)
    devices = allocate_devices(
        cfg, need_ref=cfg.policy.kl_coef > 0 and not cfg.model.lora.enabled, num_gpus=num_gpus, num_cpus=max(cores, 4)
    )
    return plan_placement(cfg, devices, mode, cores=cores)


def test_sync_roles_take_turns_in_the_driver_with_every_core():
    p = _placement("sync")
    assert not p.uses_ray
    assert (p.collector.threads, p.learner.threads, p.reference.threads, p.driver_threads) == (2, 2, 2, 2)
    assert not p.reference.actors  # on a CPU-only machine the reference scores in the driver (auto)


def test_async_roles_split_the_cores():
    p = _placement("async")
    assert p.collector.actors and p.reference.actors and not p.learner.actors  # the reference is a stage (auto)
    assert (p.collector.threads, p.reference.threads, p.learner.threads, p.driver_threads) == (1, 1, 1, 1)
    assert p.ray_cpus == 2  # a collector and a reference actor of one thread each
    assert not _placement("async", **{"ref_model.placement": "learner"}).reference.actors
    p = _placement(
        "async",
        cores=16,
        **{"inference_model.num_devices": 2, "train_model.num_devices": 2, "ref_model.placement": "learner"},
    )
    assert p.collector.threads == p.learner.threads == 4  # 2 collectors + 2 ranks busy at once
    assert p.learner.actors and p.ray_cpus == 16


def test_reference_placement():
    assert _placement("async", **{"ref_model.num_devices": 2}).reference.actors  # sharded over replicas
    assert _placement("sync", **{"ref_model.placement": "actor"}).reference.actors
    assert _placement("sync", **{"policy.kl_coef": 0.0}).reference is None
    assert _placement("sync", **{"model.lora.enabled": True}).reference is None  # the learner's own model
    # on GPUs the reference gets its own GPU and becomes a stage of its own
    on_gpu = _placement("async", num_gpus=3)
    assert on_gpu.reference.actors and on_gpu.reference.devices == (torch.device("cuda", 1),)
    assert on_gpu.actor_gpus == [torch.device("cuda", 2), torch.device("cuda", 1)]  # the learner's GPU stays out
    table = on_gpu.describe()
    assert "reference" in table and "cuda:1" in table and "driver process" in table


def test_actor_options_carry_threads_and_one_gpu():
    cpu = _placement("async").collector.ray_options(max_concurrency=4)
    assert cpu["num_cpus"] == 1 and cpu["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert cpu["max_concurrency"] == 4
    gpu = _placement("async", num_gpus=3).collector.ray_options()
    assert gpu["num_gpus"] == 1 and gpu["num_cpus"] == 1


def test_actors_that_share_one_gpu_ask_for_a_share_of_it():
    one = _placement("async", num_gpus=1)  # collector and reference actors, the learner in the driver: all cuda:0
    assert one.collector.actors and one.reference.actors
    assert one.collector.ray_options()["num_gpus"] == one.reference.ray_options()["num_gpus"] == 0.5
    assert one.actor_gpus == [torch.device("cuda", 0)] * 2
    assert _placement("async", num_gpus=1, **{"ref_model.placement": "learner"}).collector.gpu_fraction == 1.0
    assert not _placement("sync", num_gpus=1).uses_ray  # the synchronous loop takes turns in one process


def test_an_actor_slice_places_the_reward_model_on_the_actors_device(tiny_model_dir, tmp_path, monkeypatch):
    """Inside a collector actor nothing allocates devices again: the reward model gets the actor's device."""
    from omegaconf import OmegaConf

    from grpo_rl.config.schema import GRPOConfig
    from grpo_rl.placement.context import ACTOR_SECTIONS, ActorSpec, resolve_run_precision
    from grpo_rl.placement.devices import DeviceAllocation

    # Recorded rather than read back: once a vLLM engine has run in this process, it has made
    # torch.set_num_threads a no-op, so the global count says nothing about what enter() asked for.
    threads_set = []
    monkeypatch.setattr(torch, "set_num_threads", threads_set.append)

    def spec(reward_model: str | None):
        cfg = OmegaConf.structured(GRPOConfig)
        cfg.inference_model.precision = "float32"
        cfg.reward.model_path = reward_model
        precision = resolve_run_precision(cfg, DeviceAllocation(train=(cpu,), ref=(cpu,), inference=(cpu,)))
        return ActorSpec(
            cfg={
                name: value
                for name, value in OmegaConf.to_container(cfg).items()
                if name in ACTOR_SECTIONS["collector"]
            },
            run_dir=str(tmp_path),
            model_path=str(tiny_model_dir),
            role="collector",
            index=0,
            device=cpu,
            threads=1,
            mode="async",
            precision=precision,
        )

    cpu = torch.device("cpu")
    run = spec(str(tiny_model_dir)).enter()
    assert run.devices.reward_model == (cpu,)
    assert threads_set == [1]  # the slice's threads, set once here
    assert spec(None).enter().devices.reward_model == ()


def test_stream_position_moves_its_watermark_over_consumed_groups():
    pos = StreamPosition(CountingEnv(prompts_per_step=2))
    pos.consume([1, 3])  # groups finish out of order
    assert (pos.next_group, sorted(pos.consumed), pos.state_dict()["resets"]) == (0, [1, 3], 0)
    pos.consume([0])
    assert (pos.next_group, sorted(pos.consumed)) == (2, [3])
    assert pos.state_dict()["resets"] == 1  # the env at the start of the watermark's batch (groups 2 and 3)
    with pytest.raises(RuntimeError, match="group 3 .* twice"):
        pos.consume([3])
    resumed = StreamPosition(CountingEnv(prompts_per_step=2))
    resumed.load_state_dict(pos.state_dict())
    assert (resumed.next_group, resumed.consumed, resumed.state_dict()) == (2, {3}, pos.state_dict())
    assert resumed.prompts(resumed.env).row(3)["prompt_index"].tolist() == [3]


def test_a_position_that_counted_batches_is_read_in_groups():
    pos = StreamPosition(CountingEnv(prompts_per_step=2))
    pos.load_state_dict({"resets": 2, "next_index": 2, "consumed": [3]})  # batches 0, 1 and 3 consumed
    assert (pos.next_group, sorted(pos.consumed), pos.state_dict()["resets"]) == (4, [6, 7], 2)


def test_replicas_share_the_stream_and_skip_what_was_consumed():
    def first(position, replica, replicas, n=4):
        return list(itertools.islice(owed_groups(position, replica, replicas), n))

    assert first(None, 0, 2) == [0, 2, 4, 6] and first(None, 1, 2) == [1, 3, 5, 7]
    resumed = {"next_group": 4, "consumed_groups": [5, 8]}
    assert first(resumed, 0, 1) == [4, 6, 7, 9]  # 5 and 8 were trained on before the stop; 4, 6, 7 were not
    assert first(resumed, 1, 2) == [7, 9, 11, 13]


def test_in_process_source_collects_the_next_p_groups_in_order_and_skips_consumed_ones():
    source = InProcessRollouts(StreamingCollector(prompts_per_step=2))
    rollouts = [source.next_batch(version=v) for v in range(3)]
    assert [r.batch["group_index"].tolist() for r in rollouts] == [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5]]
    assert rollouts[1].batch["policy_version"].tolist() == [1, 1, 1, 1]
    assert rollouts[0].metrics["generation_tokens_per_second"] == pytest.approx(2.0)
    assert rollouts[0].failure_examples == [{"group": 0}, {"group": 1}]
    assert source.state_dict() == {"resets": 3, "next_group": 6, "consumed_groups": []}
    resumed = InProcessRollouts(StreamingCollector(prompts_per_step=2))
    resumed.load_state_dict({"resets": 3, "next_group": 6, "consumed_groups": [7]})  # an asynchronous run's
    assert resumed.next_batch(3).batch["group_index"].tolist() == [6, 6, 8, 8]


def test_a_learner_group_step_takes_as_long_as_its_slowest_rank():
    from grpo_rl.distributed.learner_group import combine_rank_metrics

    ranks = [
        {"loss": 0.5, "num_micro_batches": 2.0, "simulated_training_seconds": 1.0, "version": 3},
        {"loss": 0.5, "num_micro_batches": 1.0, "simulated_training_seconds": 1.3, "version": 3},
    ]
    out = combine_rank_metrics(ranks)
    assert out == {"loss": 0.5, "num_micro_batches": 3.0, "simulated_training_seconds": 1.3, "version": 3}
