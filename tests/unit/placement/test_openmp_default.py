"""Importing grpo_rl sets OpenMP's wait policy before torch loads, keeps a user's value, and actors inherit it
(and the oneDNN cache caps of test_onednn_cache.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import grpo_rl, os; print(os.environ.get('OMP_WAIT_POLICY'))"


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE"), ("passive", "passive")])
def test_import_sets_a_passive_wait_policy_unless_one_is_given(given, seen):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == seen


def test_ray_actors_inherit_the_wait_policy():
    import torch

    import grpo_rl
    from grpo_rl.placement.context import RolePlacement

    assert os.environ["OMP_WAIT_POLICY"]  # this process imported grpo_rl, so it has one
    options = RolePlacement("collector", (torch.device("cpu"),), 1, actors=True).ray_options()
    env = options["runtime_env"]["env_vars"]
    assert env["OMP_WAIT_POLICY"] == os.environ["OMP_WAIT_POLICY"]
    assert set(grpo_rl.OPENMP_DEFAULTS) <= set(env)
    assert {k: env[k] for k in grpo_rl.ONEDNN_DEFAULTS} == {k: os.environ[k] for k in grpo_rl.ONEDNN_DEFAULTS}
