"""A run that heals itself: workers SIGKILLed mid-run are replaced, and no batch is trained twice or lost.

The asynchronous runs here use the timed stand-ins of ``simulate.enabled`` for generation, reference scoring and
training (grpo_rl/training/simulated.py): the collector, reference and learner processes, their environments,
rewards, buffer, weight pushes, checkpoints and logs are the real ones, and they are what is killed and replaced.
The learner-restart test of the synchronous script trains a real tiny model and compares its losses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from grpo_rl.run.metrics import read_jsonl
from tests.integration.helpers import ROOT, assert_groups_trained_once, read_metrics, script_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def simulated(model_dir: Path, run_dir: Path, steps: int, **extra) -> list[str]:
    base = {
        "model.name": str(model_dir),
        "output_dir": str(run_dir),
        "logger.backend": "none",
        "logger.num_examine": 0,
        "eval.every": 0,
        "env.prompts_per_step": 2,
        "env.group_size": 4,
        "simulate.enabled": "true",
        "simulate.generation_seconds": 0.6,
        "simulate.reference_seconds": 0.2,
        "simulate.training_seconds": 0.3,
        "train.steps": steps,
        "pipeline.timeout_seconds": 60,
        "train_model.precision": "float32",
        "ref_model.precision": "float32",
        "inference_model.precision": "float32",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def start(script: str, overrides: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "sota" / script), *overrides],
        cwd=ROOT,
        env=script_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kill_when(proc: subprocess.Popen, run_dir: Path, plan: list[tuple], timeout: float = 300) -> None:
    """For each ``(steps, role, index[, signal])``: once ``steps`` steps are logged, send worker ``index`` of
    ``role`` the signal (SIGKILL by default; its process id from the run's ``processes.json``, which names the
    replacements too)."""
    deadline = time.monotonic() + timeout
    for steps, role, index, *how in plan:
        while len(read_jsonl(run_dir / "metrics.jsonl")) < steps:
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                raise AssertionError(f"the run ended before step {steps}:\n{out[-4000:]}")
            assert time.monotonic() < deadline, f"no step {steps} within {timeout:g} s"
            time.sleep(0.2)
        pid = json.loads((run_dir / "processes.json").read_text())[role][index]
        os.kill(pid, how[0] if how else signal.SIGKILL)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    """The run's output once it ends; past ``timeout`` it is killed and the test fails with the output's tail."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the run did not end within {timeout:g} s:\n{out[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out


def assert_trained_exactly_once(run_dir: Path, overrides: list[str], steps: int) -> list[int]:
    """Every step logged once; no group trained twice; every group below the final checkpoint's watermark trained
    (the ones above it that were trained are recorded consumed there); each group's prompt is the one the
    environment's stream draws for its index. Returns the trained group indices in training order."""
    from omegaconf import OmegaConf

    from grpo_rl.config.schema import GRPOConfig
    from grpo_rl.envs import make_env
    from grpo_rl.model.loading import load_tokenizer

    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, steps + 1))
    records = read_jsonl(run_dir / "trained.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    trained = assert_groups_trained_once(run_dir)
    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.from_dotlist(overrides))
    per_batch = cfg.env.prompts_per_step
    assert len(trained) == steps * per_batch, trained
    env = make_env(cfg, load_tokenizer(cfg.model.name))
    draws = [int(i) for _ in range(max(trained) // per_batch + 1) for i in env.reset()["prompt_index"]]
    for r in records:
        assert r["group_prompt_index"] == [draws[g] for g in r["group_group_index"]], r
    return trained


def test_killed_collectors_reference_and_learner_rank_heal_and_every_batch_is_trained_once(tiny_model_dir, tmp_path):
    """Two collectors, a reference actor and a learner rank of an asynchronous run are SIGKILLed (a collector
    twice): each collector and the reference is replaced and regenerates (or rescores) what it owed; the learner
    group starts again from the last checkpoint, the collectors going back to its stream position. The run completes
    its steps, each logged once, training each batch of the prompt stream once."""
    run_dir, steps = tmp_path / "healed", 14
    overrides = simulated(
        tiny_model_dir,
        run_dir,
        steps,
        **{
            "inference_model.num_devices": 2,
            "policy.kl_coef": 0.01,
            "ref_model.placement": "actor",
            "train_model.num_devices": 2,
            "train.checkpoint_frequency": 4,
        },
    )
    proc = start("grpo-async.py", overrides)
    kill_when(proc, run_dir, [(3, "collector", 0), (5, "reference", 0), (7, "collector", 1), (10, "learner", 1)])
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "starting the learner group again from the last checkpoint" in out
    assert_trained_exactly_once(run_dir, overrides, steps)
    replaced = read_jsonl(run_dir / "restarts.jsonl")
    assert sorted((r["role"], r["replica"]) for r in replaced) == [
        ("collector", 0),
        ("collector", 1),
        ("learner", 0),
        ("reference", 0),
    ], replaced
    assert all("died" in r["cause"] and r["seconds"] > 0 for r in replaced), replaced
    (learner,) = [r for r in replaced if r["role"] == "learner"]
    assert learner["step"] in (8, 12), learner  # the newest checkpoint (every 4 steps) when the rank was lost
    last = read_metrics(run_dir)[-1]
    assert (last["restarts/collector"], last["restarts/reference"], last["restarts/learner"]) == (2, 1, 1)
    assert sum(r["restart_seconds"] for r in read_metrics(run_dir)) > 0


def test_a_silent_collector_is_replaced_and_past_max_restarts_the_run_ends_naming_it(tiny_model_dir, tmp_path):
    """pipeline.max_restarts=1: a collector that stops answering (SIGSTOP) is replaced once no batch came for
    pipeline.timeout_seconds; the next loss (SIGKILL) ends the run in one line naming the collector, after a
    checkpoint of its last completed step, and leaves no process of the run behind."""
    from grpo_rl.run.checkpoint import Checkpointer, load_trainer_state
    from tests.integration.test_async import _processes_with

    run_dir, tag = tmp_path / "exhausted", f"grpo-test-{uuid.uuid4().hex}"
    proc = start(
        "grpo-async.py",
        simulated(
            tiny_model_dir,
            run_dir,
            1000,
            **{"pipeline.max_restarts": 1, "policy.kl_coef": 0, "pipeline.timeout_seconds": 20},
        ),
        GRPO_TEST_RUN_TAG=tag,
    )
    kill_when(proc, run_dir, [(2, "collector", 0, signal.SIGSTOP), (4, "collector", 0)])
    out = finish(proc)
    (silent,) = read_jsonl(run_dir / "restarts.jsonl")
    assert silent["cause"] == "no answer within pipeline.timeout_seconds=20", silent
    assert proc.returncode == 1, out[-4000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: collector replica 0") and "pipeline.max_restarts=1" in last, out[-3000:]
    # the dead collector was noticed as dead (its actor's death), not by the silence that found the stopped one
    assert " died (" in last and "no answer within" not in last, last
    logged = [r["step"] for r in read_metrics(run_dir)]
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= 4
    assert int(load_trainer_state(Checkpointer(run_dir).latest())["step"]) == logged[-1]
    deadline, left = time.monotonic() + 30, _processes_with(tag)
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = _processes_with(tag)
    assert not left, f"processes of the run outlived it: {left}"


def test_a_lost_learner_rank_restarts_the_synchronous_run_with_the_losses_of_an_unbroken_one(tokenizer_dir, tmp_path):
    """A rank of a two-rank learner is SIGKILLed during step 4 of a synchronous run: the group starts again from
    the step-2 checkpoint, and every step's losses, rewards and gradient norms equal those of a run that lost
    nothing (a synchronous resume is exact)."""
    from grpo_rl.model.loading import build_tiny_model
    from tests.integration.test_resume import REWARD_FILE

    model = build_tiny_model(str(tokenizer_dir), tmp_path / "peaked", initializer_range=1.0)
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FILE)
    steps = 5

    def overrides(run_dir: Path) -> list[str]:
        return [
            f"model.name={model}",
            f"output_dir={run_dir}",
            f"train.steps={steps}",
            "seed=3",
            "logger.backend=none",
            "logger.num_examine=0",
            "eval.every=0",
            "sampling.max_new_tokens=12",
            "env.prompts_per_step=2",
            "env.group_size=4",
            "optimizer.lr=3e-3",
            "policy.kl_coef=0",
            "inference_model.max_model_len=512",
            "inference_model.kv_cache_gb=1",
            "env.max_prompt_tokens=300",
            f"reward.path={reward}",
            "reward.name=early_letters",
            "train_model.num_devices=2",
            "train.checkpoint_frequency=2",
            "pipeline.timeout_seconds=60",
            "train_model.precision=float32",
            "inference_model.engine=transformers",  # no vLLM start: this test is about the learner
            "inference_model.precision=float32",
            "ref_model.precision=float32",
        ]

    broken = start("grpo.py", overrides(tmp_path / "broken"))
    kill_when(broken, tmp_path / "broken", [(3, "learner", 1)])
    out = finish(broken)
    assert broken.returncode == 0, out[-4000:]
    (restart,) = read_jsonl(tmp_path / "broken" / "restarts.jsonl")
    assert restart["role"] == "learner" and restart["step"] in (2, 4), restart
    unbroken = start("grpo.py", overrides(tmp_path / "unbroken"))
    out = finish(unbroken)
    assert unbroken.returncode == 0, out[-4000:]
    a, b = read_metrics(tmp_path / "broken"), read_metrics(tmp_path / "unbroken")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    assert any(r["grad_norm"] > 0 for r in b)  # the comparison can fail: the updates are not zero
    for x, y in zip(a, b, strict=True):
        for key in ("loss", "loss_policy", "reward_mean", "reward_std", "grad_norm", "entropy", "clip_fraction"):
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7), (x["step"], key, x[key], y[key])


def test_a_lost_node_takes_its_collector_which_comes_back_on_the_surviving_node(tiny_model_dir, tmp_path):
    """Across machines, on one: a Ray cluster of two nodes (Ray's own test utility), the run joined to it with
    ``ray.address``, its two collectors spread over both nodes. The second node is removed mid-run: its collector
    is replaced on the head node, and the run completes, each batch trained once."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        run_dir, steps = tmp_path / "nodes", 10
        overrides = simulated(
            tiny_model_dir,
            run_dir,
            steps,
            **{"inference_model.num_devices": 2, "policy.kl_coef": 0, "ray.address": cluster.address},
        )
        proc = start("grpo-async.py", overrides)
        deadline = time.monotonic() + 300
        while len(read_jsonl(run_dir / "metrics.jsonl")) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before step 3"
            time.sleep(0.2)
        cluster.remove_node(second)
        out = finish(proc)
    finally:
        cluster.shutdown()
    assert proc.returncode == 0, out[-4000:]
    assert "joined Ray cluster" in out
    (restart,) = read_jsonl(run_dir / "restarts.jsonl")
    assert restart["role"] == "collector" and restart["cause"] == "died (its node died)", restart
    assert_trained_exactly_once(run_dir, overrides, steps)
