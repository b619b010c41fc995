"""The engine key reaches only the actors that talk to engine servers: a runtime_env is stored in Ray's GCS, so a
learner rank or a reference replica must never carry it, and a collector only when its engine is a server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.distributed.pipeline import collector_options
from grpo_rl.engines.vllm_plugin import KEY_ENV
from grpo_rl.placement.context import plan_placement
from grpo_rl.placement.devices import allocate_devices


def _placement(**overrides):
    cfg = OmegaConf.merge(
        OmegaConf.structured(GRPOConfig), OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()])
    )
    devices = allocate_devices(cfg, need_ref=True, num_gpus=0, num_cpus=8)
    return plan_placement(cfg, devices, "async", cores=8)


def _env(options: dict) -> dict:
    return options["runtime_env"]["env_vars"]


@pytest.mark.parametrize("engine", ["vllm_server", "vllm"])
def test_only_collectors_of_served_engines_carry_the_key(engine, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "the-run-key")
    placement = _placement(
        **{
            "inference_model.engine": engine,
            "train_model.num_devices": 2,
            "policy.kl_coef": 0.1,
            "ref_model.placement": "actor",
        }
    )
    assert placement.learner.actors and placement.reference.actors and placement.collector.actors
    for role in (placement.learner, placement.reference):
        assert KEY_ENV not in _env(role.ray_options()), f"the {role.role}'s runtime_env carries the engine key"
        assert KEY_ENV not in _env(role.ray_options(scheduling_strategy="SPREAD"))
    collector = _env(collector_options(SimpleNamespace(placement=placement)))
    if engine == "vllm_server":
        assert collector[KEY_ENV] == "the-run-key" and collector["OMP_NUM_THREADS"]  # the key on top of the rest
    else:  # an in-process engine talks to no server
        assert KEY_ENV not in collector
