"""The asynchronous loop on Ray with a tiny model: weight pushes across processes, both scripts, shutdown.

Each test starts its own Ray instance (in this process or in the script's) and stops it again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from grpo_rl.run.metrics import read_jsonl
from tests.integration.helpers import (
    FLAKY_REWARD,
    NOT_VLLM,
    ROOT,
    SHARED_STEP_METRICS,
    assert_groups_trained_once,
    read_metrics,
    script_env,
    start_up_noise,
    trained_groups,
)
from tests.integration.helpers import run_script as _run_script

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def tiny_overrides(model_dir: Path, run_dir: Path, **extra) -> list[str]:
    """Settings that keep a step to about a second on 2 CPU cores."""
    base = {
        "model.name": str(model_dir),
        "output_dir": str(run_dir),
        "logger.backend": "none",
        "logger.num_examine": 0,
        "env.prompts_per_step": 2,
        "env.group_size": 4,
        "sampling.max_new_tokens": 16,
        "policy.kl_coef": 0.0,
        "inference_model.kv_cache_gb": 1,
        "inference_model.max_model_len": 512,
        "eval.every": 0,
        "train.checkpoint_frequency": 0,
        # fp32 on every CPU kind: engine and learner log-probs are compared at fp32's tolerance
        "train_model.precision": "float32",
        "ref_model.precision": "float32",
        "inference_model.precision": "float32",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def run_script(script: str, overrides: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    proc = _run_script(script, *overrides, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.mark.parametrize("transport", ["object_store", "collective", "object_store+lora"])
def test_engine_in_actor_matches_learner_after_each_push(tiny_model_dir, tmp_path, monkeypatch, transport):
    """Engine log-probs (in the collector actor) equal the learner's own (here) for the same tokens, 1e-4, after
    pushes through either transport (collective: a gloo broadcast across processes, the code NCCL runs on GPUs),
    and of a LoRA learner's adapter alone (model.lora.push=adapter, vLLM in a collector); a collector that
    dies, with no replacements allowed, makes the learner's wait raise, naming it, instead of hang (replacements:
    tests/integration/test_healing.py)."""
    import contextlib

    from omegaconf import OmegaConf

    from grpo_rl.config.schema import GRPOConfig
    from grpo_rl.envs import make_env
    from grpo_rl.errors import RoleFailed
    from grpo_rl.model.logprobs import sequence_logprobs
    from grpo_rl.model.packing import trim_padding
    from grpo_rl.run.roles import make_learner, make_rollout_source, start_roles
    from grpo_rl.run.setup import make_run

    monkeypatch.setenv("GRPO_DATA_DIR", script_env()["GRPO_DATA_DIR"])
    cfg = OmegaConf.merge(
        OmegaConf.structured(GRPOConfig),
        OmegaConf.from_dotlist(
            tiny_overrides(
                tiny_model_dir,
                tmp_path,
                **{
                    "pipeline.max_staleness": 0,
                    "pipeline.buffer_capacity": 1,
                    "pipeline.weight_transport": transport.split("+")[0],
                    "pipeline.timeout_seconds": 300,
                    "pipeline.max_restarts": 0,
                    **(
                        {"model.lora.enabled": True, "model.lora.r": 4, "model.lora.push": "adapter"}
                        if transport.endswith("+lora")
                        else {}
                    ),
                },
            )
        ),
    )
    run = make_run(cfg, tmp_path, mode="async")
    lora = transport.endswith("+lora")
    assert cfg.model.lora.push == ("adapter" if lora else "auto")
    with contextlib.ExitStack() as cleanup:
        start_roles(run, cleanup)
        rollouts, _ = make_rollout_source(run, make_env(cfg, run.tokenizer, devices=run.devices))
        cleanup.callback(rollouts.close)
        learner = make_learner(run)
        sync = rollouts.weight_sync  # built over the collectors once they started
        cleanup.callback(sync.close)

        def max_gap(batch) -> float:
            b = trim_padding(batch)
            with torch.no_grad():
                mine = sequence_logprobs(learner.model, b, temperature=cfg.sampling.temperature).logprobs
            return float(((mine - b["behavior_logprobs"]).abs() * b["response_mask"]).max())

        before = rollouts.next_batch(0).batch
        assert max_gap(before) < 1e-4  # the engine starts from the learner's weights
        for version in (1, 2):  # two pushes: the second goes into an engine that was already updated
            torch.manual_seed(version)
            with torch.no_grad():
                for p in learner.model.parameters():
                    if p.requires_grad:  # a LoRA learner's adapter alone: its base stays the engine's
                        p.add_(0.05 * torch.randn_like(p))
            learner.version = version
            pushed = learner.weights_for_push()
            assert all(".lora_" in name for name, _ in pushed) == lora
            sync.push(pushed, version)
            after = rollouts.next_batch(version).batch  # max_staleness=0: only samples of the pushed version pass
            assert bool((after["policy_version"] == version).all())
            assert max_gap(after) < 1e-4, f"engine and learner disagree after push {version}"
        assert max_gap(before) > 1e-2  # the check can fail: old samples no longer match the new weights

        import ray  # a collector that dies is noticed by the learner's next wait, which raises

        ray.kill(rollouts.collectors[0])
        with pytest.raises(RoleFailed, match="collector replica 0"):
            rollouts.next_batch(99)


def test_a_lora_run_pushes_its_adapter_to_vllm_in_the_collector(tiny_model_dir, tmp_path):
    """A LoRA run of the asynchronous script with a KL penalty: its reference is the learner's own model with the
    adapters off (built after the learner, in the driver), and its pushes carry the adapter alone into the
    collector's vLLM (model.lora.push=adapter)."""
    from tests.integration.test_resume import REWARD_FILE  # rewards that vary within a group: the policy moves

    run_dir, reward = tmp_path / "lora", tmp_path / "rewards.py"
    reward.write_text(REWARD_FILE)
    run_script(
        "grpo-async.py",
        tiny_overrides(
            tiny_model_dir,
            run_dir,
            **{
                "train.steps": 3,
                "model.lora.enabled": True,
                "model.lora.r": 4,
                "model.lora.push": "adapter",
                "policy.kl_coef": 0.05,
                "optimizer.lr": 0.01,  # the adapter moves far in a step: a stale one in the engine would show
                "pipeline.max_staleness": 0,  # each batch sampled by the policy it trains
                "reward.path": str(reward),
                "reward.name": "early_letters",
            },
        ),
    )
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["policy_version"] == 3
    assert rows[-1]["kl_ref"] > 0  # the reference (adapters off) is no longer the policy
    # the engine sampled with the learner's adapter (an engine one adapter behind: KL of the order of kl_ref)
    assert all(abs(r["kl_engine"]) < 1e-5 for r in rows), [r["kl_engine"] for r in rows]


def test_async_script_bounds_staleness_and_buffer(tiny_model_dir, tmp_path):
    """Two engine replicas feed one buffer; every trained sample is within the staleness bound, and none was
    generated to be thrown away (the buffer admits a batch only while it will be fresh when taken)."""
    run_dir = tmp_path / "async"
    proc = run_script(
        "grpo-async.py",
        [
            *tiny_overrides(
                tiny_model_dir,
                run_dir,
                **{
                    "train.steps": 4,
                    "pipeline.max_staleness": 1,
                    "pipeline.buffer_capacity": 1,
                    "inference_model.num_devices": 2,
                    "logger.num_examine": 8,
                    "logger.examine_every": 1,
                    "eval.every": 2,
                    "eval.num_prompts": 2,
                    "eval.pass_k": 2,
                },
            ),
            NOT_VLLM,  # the engine in an actor under vLLM: the transport tests above, and test_sigint_... below
        ],
    )
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:  # the bound holds for every sample trained on, step by step
        # step s takes at policy version s - 1 (one update per batch), from samples of version 0 or later
        assert 0 <= r["staleness_mean"] <= r["staleness_max"] <= min(1, r["step"] - 1), r
        assert 0 <= r["collector_busy_fraction"] <= 1 and r["reward_failures"] == 0
        for key in (
            "tis_fraction",
            "dropped_samples",
            "learner_wait_seconds",
            "collector_wait_seconds",
            "collector_samples_per_second",
            "learner_samples_per_second",
            *SHARED_STEP_METRICS,
        ):
            assert key in r, key  # the shared names are the synchronous loop's (test_sync_script.py)
    assert rows[-1]["policy_version"] == 4
    # the collectors are admitted only while their batch will be within the bound: nothing is dropped, and the
    # buffer's running count agrees with the steps' own
    assert [r["dropped_samples"] for r in rows] == [0, 0, 0, 0]
    assert [r["dropped_samples_total"] for r in rows] == [0, 0, 0, 0]
    evals = [r for r in rows if "eval/accuracy" in r]  # held-out evaluation by the first engine replica
    assert [r["step"] for r in evals] == [2, 4] and all(r["eval/policy_version"] == r["step"] for r in evals)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    prompts_by_step: dict[int, set] = {}
    for row in samples:
        prompts_by_step.setdefault(row["step"], set()).add(row["prompt"])
    trained = [p for step in sorted(prompts_by_step) for p in prompts_by_step[step]]
    assert len(trained) == 4 * 2 and len(set(trained)) == len(trained)  # the replicas share prompts out
    assert (run_dir / "checkpoints" / "step_00000004" / "trainer_state.pt").exists()
    assert (run_dir / "final_model" / "config.json").exists()
    assert start_up_noise(proc) == []  # nor anything from the Ray actors (each a process with its own imports)


def _processes_with(tag: str) -> list[str]:
    """Command lines of live processes whose environment carries ``tag`` (the run's Ray and vLLM processes)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if tag.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found


def test_sigint_stops_every_process_checkpoints_and_resumes(tiny_model_dir, tmp_path):
    """Ctrl-C: the step in progress finishes, a checkpoint is written, no Ray or vLLM process of the run remains;
    resume=auto then goes on from that checkpoint, with the collectors at their saved round."""
    run_dir, tag = tmp_path / "interrupted", f"grpo-test-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "sota" / "grpo-async.py"),
            *tiny_overrides(tiny_model_dir, run_dir, **{"train.steps": 1000}),
        ],
        cwd=ROOT,
        env=script_env(GRPO_TEST_RUN_TAG=tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    first_step = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "step 1/1000 |" in line:
                first_step.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first_step.wait(timeout=240), "no first step:\n" + "".join(lines[-60:])
        assert _processes_with(tag), "the tag did not reach the run's processes; the check below would be vacuous"
        os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C in a terminal: the driver and Ray's processes
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=10)
    log = "".join(lines)
    assert proc.returncode == 0 and "SIGINT: stopping at the next phase boundary" in log, log[-5000:]
    assert list((run_dir / "checkpoints").glob("step_*/trainer_state.pt")), log[-5000:]
    deadline, left = time.monotonic() + 30, _processes_with(tag)
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = _processes_with(tag)
    assert not left, f"processes of the run outlived it: {left}"

    from grpo_rl.run.checkpoint import Checkpointer, load_trainer_state

    checkpoint = Checkpointer(run_dir).latest()
    state = load_trainer_state(checkpoint)
    saved = int(state["step"])
    # Nothing dropped: the learner consumed `saved` steps' groups, as they finished; what the collector had made
    # beyond them (in the buffer at the stop) is not marked consumed, so it is made again.
    stream = state["env"]
    assert stream["next_group"] + len(stream["consumed_groups"]) == 2 * saved and saved >= 1
    resumed = run_script(  # the engine holds no state a checkpoint keeps: the resumed run may use another
        "grpo-async.py",
        [*tiny_overrides(tiny_model_dir, run_dir, **{"train.steps": saved + 2, "resume": "auto"}), NOT_VLLM],
    )
    assert f"resumed from {checkpoint}" in resumed.stdout + resumed.stderr
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, saved + 3))
    assert read_metrics(run_dir)[-1]["policy_version"] == saved + 2
    assert len(assert_groups_trained_once(run_dir)) == 2 * (saved + 2)


def test_sigkilled_async_run_resumes_training_on_every_drawn_prompt_exactly_once(tiny_model_dir, tmp_path, monkeypatch):
    """SIGKILL an async run while batches wait in its buffer; the resumed run trains on every batch of the stream
    exactly once, with the prompts the stream holds there (counted by prompt index across both runs' logs)."""
    from omegaconf import OmegaConf

    from grpo_rl.config.schema import GRPOConfig
    from grpo_rl.envs import make_env
    from grpo_rl.model.loading import load_tokenizer

    run_dir, tag, steps = tmp_path / "killed", f"grpo-test-{uuid.uuid4().hex}", 7
    # a learner slower than the collector (2 updates per batch) keeps the buffer full; nothing is too stale to train on
    settings = {
        "train.checkpoint_frequency": 1,
        "train.updates_per_batch": 2,
        "pipeline.max_staleness": 100,
        "pipeline.buffer_capacity": 2,
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "sota" / "grpo-async.py"),
            *tiny_overrides(tiny_model_dir, run_dir, **{**settings, "train.steps": 1000}),
            NOT_VLLM,
        ],
        cwd=ROOT,
        env=script_env(GRPO_TEST_RUN_TAG=tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while len(read_jsonl(run_dir / "trained.jsonl")) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(read_jsonl(run_dir / "trained.jsonl")) >= 3, "the run made no third step"
        time.sleep(float(torch.rand(1)) * 2)  # somewhere in a later step
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_processes_with(tag)  # Ray's own processes outlive a SIGKILLed driver
    first = trained_groups(run_dir)

    resumed = run_script(
        "grpo-async.py",
        [*tiny_overrides(tiny_model_dir, run_dir, **{**settings, "train.steps": steps, "resume": "auto"}), NOT_VLLM],
        timeout=300,
    )
    assert "resumed from" in resumed.stdout + resumed.stderr
    records = read_jsonl(run_dir / "trained.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    groups = trained_groups(run_dir)
    resumed_from = [line for line in (resumed.stdout + resumed.stderr).splitlines() if "resumed from" in line]
    print(f"trained before the kill: groups {first}; {resumed_from[-1:]}; after the resume: {groups}")
    # one collector whose engine finishes the groups of a call together, in order: the stream's groups in turn
    assert groups == list(range(2 * steps)), f"before the kill {first}, after the resume {groups}"
    # The prompts trained on are the stream's, each group's once: what the synchronous loop would have drawn.
    monkeypatch.setenv("GRPO_DATA_DIR", script_env()["GRPO_DATA_DIR"])
    cfg = OmegaConf.merge(
        OmegaConf.structured(GRPOConfig), OmegaConf.from_dotlist(tiny_overrides(tiny_model_dir, run_dir))
    )
    env = make_env(cfg, load_tokenizer(str(tiny_model_dir)))
    expected = [int(i) for _ in range(steps) for i in env.reset()["prompt_index"]]
    assert [p for r in records for p in r["group_prompt_index"]] == expected


def _kill_processes_with(tag: str) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if tag.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue


def test_reference_stage_shards_a_batch_and_scores_as_the_in_learner_reference(tiny_model_dir, tmp_path):
    """ref_model.num_devices=2: two reference actors score one batch, cut into whole groups, exactly as the
    reference in the learner's process does."""
    import contextlib

    from omegaconf import OmegaConf

    from grpo_rl.config.schema import GRPOConfig
    from grpo_rl.distributed.reference_actors import ReferenceActors
    from grpo_rl.run.roles import make_reference, start_roles
    from grpo_rl.run.setup import make_run
    from grpo_rl.training.build import make_ref_scorer
    from tests.integration.test_data_parallel import grpo_batch

    cfg = OmegaConf.merge(
        OmegaConf.structured(GRPOConfig),
        OmegaConf.from_dotlist(
            tiny_overrides(tiny_model_dir, tmp_path, **{"policy.kl_coef": 0.05, "ref_model.num_devices": 2})
        ),
    )
    run = make_run(cfg, tmp_path, mode="async")
    assert run.placement.reference.actors and run.placement.reference.count == 2
    with contextlib.ExitStack() as cleanup:
        start_roles(run, cleanup)
        stage = make_reference(run)
        assert isinstance(stage, ReferenceActors)
        cleanup.callback(stage.shutdown)
        batch = grpo_batch([4, 3, 6], vocab=run.tokenizer.vocab_size + 100, seed=3)
        remote = stage.score(batch.clone())["ref_logprobs"]
        local = make_ref_scorer(run).score(batch.clone())["ref_logprobs"]
        torch.testing.assert_close(remote, local, rtol=1e-5, atol=1e-5)
        assert float(local.abs().sum()) > 0


@pytest.mark.parametrize("script", ["grpo-async.py", "grpo.py"])
def test_scripts_with_the_reference_as_a_stage_of_its_own(tiny_model_dir, tmp_path, script):
    """The reference on two actors of its own: the async loop scores the next batch while the learner trains (and
    logs its seconds under the synchronous loop's name); the sync loop calls the same stage in line."""
    run_dir = tmp_path / script
    (tmp_path / "flaky.py").write_text(FLAKY_REWARD)  # fails on every other call, in each process
    proc = run_script(
        script,
        [
            *tiny_overrides(
                tiny_model_dir,
                run_dir,
                **{
                    "train.steps": 3,
                    "policy.kl_coef": 0.05,
                    "ref_model.num_devices": 2,
                    "pipeline.max_staleness": 3,
                    "reward.functions": f"[{{path: {tmp_path / 'flaky.py'}, name: flaky}}]",
                },
            ),
            NOT_VLLM,
        ],
    )
    assert "reference    2 Ray actors" in proc.stdout + proc.stderr  # the placement table
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # Failing reward calls reach the learner's logs through both stages, with the step that trained on them (in
    # the async loop they travel with their batch through the buffers).
    failures = [json.loads(line) for line in (run_dir / "reward_failures.jsonl").read_text().splitlines()]
    assert failures and all(f["reward"] == "flaky" for f in failures)
    failing_steps = {r["step"] for r in rows if r["reward_failures"] > 0}
    assert {f["step"] for f in failures} <= failing_steps
    assert len(failures) <= sum(r["reward_failures"] for r in rows)
    # the batches reached the learner scored (the loss raises without ref_logprobs when kl_coef > 0); that the
    # stage's log-probs equal the in-learner reference's is checked above
    assert all(r["reference_seconds"] > 0 and "kl_ref" in r for r in rows)
    assert trained_groups(run_dir) == list(range(6))
