"""Data-parallel learner: two CPU ranks (gloo) make the same update as one process on the same batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from tests.integration.helpers import NOT_VLLM

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def grpo_batch(group_sizes: list[int], vocab: int, seed: int = 0) -> TensorDict:
    """Groups of answers to random prompts, left/right padded like the engine's output, random advantages."""
    g = torch.Generator().manual_seed(seed)
    n, lp, lr = sum(group_sizes), 12, 10
    batch = TensorDict(
        {
            "prompt_ids": torch.zeros(n, lp, dtype=torch.long),
            "prompt_mask": torch.zeros(n, lp, dtype=torch.long),
            "response_ids": torch.zeros(n, lr, dtype=torch.long),
            "response_mask": torch.zeros(n, lr, dtype=torch.long),
            "behavior_logprobs": torch.zeros(n, lr),
            "advantage": torch.randn(n, generator=g),
            "group_id": torch.repeat_interleave(torch.arange(len(group_sizes)), torch.tensor(group_sizes)),
        },
        batch_size=[n],
    )
    row = 0
    for size in group_sizes:
        plen = int(torch.randint(4, lp + 1, (1,), generator=g))
        prompt = torch.randint(0, vocab, (plen,), generator=g)
        for _ in range(size):
            rlen = int(torch.randint(2, lr + 1, (1,), generator=g))
            batch["prompt_ids"][row, lp - plen :] = prompt
            batch["prompt_mask"][row, lp - plen :] = 1
            batch["response_ids"][row, :rlen] = torch.randint(0, vocab, (rlen,), generator=g)
            batch["response_mask"][row, :rlen] = 1
            batch["behavior_logprobs"][row, :rlen] = -10.0 + torch.rand(rlen, generator=g)
            row += 1
    return batch


def make_cfg(model_dir: Path, run_dir: Path, num_devices: int, sharding: str = "none"):
    from grpo_rl.config.schema import GRPOConfig

    return OmegaConf.merge(
        OmegaConf.structured(GRPOConfig),
        OmegaConf.from_dotlist(
            [
                f"model.name={model_dir}",
                f"output_dir={run_dir}",
                f"train_model.num_devices={num_devices}",
                f"train_model.sharding={sharding if num_devices > 1 else 'none'}",
                "policy.kl_coef=0.0",
                "optimizer.lr=1e-3",
                "optimizer.warmup_steps=0",
                "train.micro_batch_tokens=64",
                # fp32 on every CPU kind: the comparison's tolerance is fp32's (auto would pick bf16 where it is fast)
                "train_model.precision=float32",
                "ref_model.precision=float32",
                "inference_model.precision=float32",
            ]
        ),
    )


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_ranks_make_the_same_update_as_one(tiny_model_dir, tmp_path, sharding):
    """Two gloo ranks, full replicas or FSDP2 shards, make the update one process makes on the whole batch; their
    pushed weights (gathered once, when sharded) give an engine the single learner's log-probs."""
    from grpo_rl.distributed.learner_group import LearnerGroup
    from grpo_rl.placement.ray import start_ray, stop_ray
    from grpo_rl.run.roles import make_learner
    from grpo_rl.run.setup import make_run

    started = start_ray(make_cfg(tiny_model_dir, tmp_path, 2).ray, min_cpus=2)  # one Ray session for both cases
    try:
        for aggregation in ("token_mean", "seq_mean_token_mean"):  # shares by tokens, and by rows
            single_cfg, dp_cfg = (
                make_cfg(tiny_model_dir, tmp_path / aggregation / str(n), n, sharding) for n in (1, 2)
            )
            for cfg in (single_cfg, dp_cfg):
                cfg.policy.aggregation = aggregation
            single = make_learner(make_run(single_cfg, single_cfg.output_dir))
            init = {k: v.clone() for k, v in single.model.state_dict().items()}
            group = make_learner(make_run(dp_cfg, dp_cfg.output_dir))
            assert isinstance(group, LearnerGroup)
            try:
                _check_same_updates(single, group, init)
                _check_push(single, group, tiny_model_dir)
            finally:
                group.shutdown()
    finally:
        stop_ray(started)


def _check_push(single, group, model_dir: Path) -> None:
    """An engine loaded with the group's push scores tokens as the single learner does (fp32, 1e-4)."""
    from grpo_rl.engines.transformers_engine import TransformersEngine
    from grpo_rl.model.logprobs import sequence_logprobs
    from grpo_rl.model.packing import trim_padding
    from grpo_rl.weights.sync import InPlaceWeightSync

    engine = TransformersEngine(str(model_dir), torch.device("cpu"), dtype="float32")
    batch = trim_padding(grpo_batch([3, 2], vocab=single.model.config.vocab_size, seed=5))

    def gap() -> float:
        with torch.no_grad():
            mine = sequence_logprobs(single.model, batch).logprobs
            theirs = sequence_logprobs(engine.model, batch).logprobs
        return float(((mine - theirs).abs() * batch["response_mask"]).max())

    assert gap() > 1e-3  # the engine starts from the file's weights, which the update moved
    InPlaceWeightSync(engine).push(group.weights_for_push(), group.version)
    assert gap() < 1e-4


def _check_same_updates(single, group, init: dict) -> None:
    # 3 groups of unequal size on 2 ranks: shards of 4 and 9 rows, several micro-batches each
    batch = grpo_batch([4, 3, 6], vocab=single.model.config.vocab_size)
    # The single learner's gradients as its optimizer sees them (summed, clipped), for the weight check below
    # (by storage, which a state_dict entry shares with its parameter, tied ones included)
    grads: list[dict[int, torch.Tensor]] = []
    single.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append(
            {p.data_ptr(): p.grad.clone() for g in opt.param_groups for p in g["params"] if p.grad is not None}
        )
    )
    steps, rates = 2, []
    for step in range(steps):
        ms, md = single.train_step(batch.clone()), group.train_step(batch.clone())
        rates.append(ms["lr"])
        assert md["num_micro_batches"] > 2
        for key in ("loss", "loss_policy", "grad_norm", "clip_fraction", "ratio_mean", "tis_fraction"):
            assert md[key] == pytest.approx(ms[key], rel=1e-5, abs=1e-7), (step, key, ms[key], md[key])
    assert group.version == single.version == 2 and len(grads) == steps
    # The weights agree to fp32's tolerance wherever Adam's update is a smooth function of the gradient. The ranks
    # sum the gradient in another order, a rounding difference (1e-11 to 1e-9 here); Adam's first step is
    # lr * g / (|g| + eps), whose slope lr * eps / (|g| + eps)^2 is 1e5 for a gradient near 0 (eps 1e-8, lr 1e-3),
    # so there the difference can grow to ~lr (measured: up to 4e-6, at 1 to 6 elements of a run, all with |g| under
    # 4e-8; which ones depends on the CPU's kernels). From |g| >= 100 eps on, it takes a gradient difference of 1e-7
    # to move a weight by 1e-6, and the second step divides by a root of the second moment at least 0.7 times the
    # first's. Everywhere an Adam step moves a weight by lr * |m^ / (sqrt(v^) + eps)| <= 1.0011 lr at most (betas
    # 0.9, 0.99; no weight decay), so the two runs' weights can be at most 2 lr per step apart.
    eps = single.optimizer.param_groups[0]["eps"]
    group.state_dict()  # refreshes the driver's copy of rank 0's weights
    theirs = dict(group.model.state_dict())
    moved = 0.0
    for name, mine in single.model.state_dict().items():
        gap = (theirs[name] - mine).abs()
        assert float(gap.max()) <= 2 * 1.01 * sum(rates), (name, float(gap.max()))
        disagree = gap > 1e-6 + 1e-5 * mine.abs()  # assert_close's test at rtol=1e-5, atol=1e-6
        if disagree.any():
            grad = grads[0].get(mine.data_ptr())
            assert grad is not None, (name, "weights differ without a gradient")
            smooth = grad.abs() >= 100 * eps
            assert not (disagree & smooth).any(), (
                name,
                int((disagree & smooth).sum()),
                "elements differ beyond fp32's tolerance where Adam is smooth",
                float(gap[disagree & smooth].max()),
            )
        moved = max(moved, float((mine - init[name]).abs().max()))
    assert moved > 1e-4  # the update is far larger than the tolerance


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_sync_script_with_two_learner_ranks(tiny_model_dir, tmp_path, sharding):
    run_dir = tmp_path / "sync_dp"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
        "GRPO_DATA_DIR": os.environ.get("GRPO_DATA_DIR", str(ROOT.parent / "shared" / "data")),
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "sota" / "grpo.py"),
            f"model.name={tiny_model_dir}",
            f"output_dir={run_dir}",
            "train_model.num_devices=2",
            f"train_model.sharding={sharding}",
            "train.steps=2",
            "logger.backend=none",
            "logger.num_examine=0",
            "env.prompts_per_step=2",
            "env.group_size=4",
            "sampling.max_new_tokens=16",
            "policy.kl_coef=0.0",
            "inference_model.kv_cache_gb=1",
            "inference_model.max_model_len=512",
            "eval.every=0",
            NOT_VLLM,
        ],  # the learner group is the subject, not the engine
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert (run_dir / "final_model" / "config.json").exists()
    assert "learner      2 Ray actors" in proc.stdout + proc.stderr  # the placement table of the start-up log
