"""``sota/grpo.py +preset=lowmem`` end to end: it trains bf16 weights with 8-bit optimizer moments and stochastic
rounding, and an engine that shares the learner's model; a run stopped after a checkpoint resumes to the same
metrics and weights, bit for bit, as a run that was never stopped (the 8-bit state round-trips the checkpoint, and
the rounding's random draws follow the restored RNG)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.helpers import read_metrics, run_script, script_env
from tests.integration.test_resume import REWARD_FILE

pytestmark = [pytest.mark.slow, pytest.mark.integration]

COMPARED = ("loss", "reward_mean", "grad_norm", "kl_ref", "entropy", "lr", "response_length_mean", "policy_version")


def _args(model_dir: Path, reward_file: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        "+preset=lowmem",
        f"model.name={model_dir}",
        f"output_dir={out}",
        f"train.steps={steps}",
        "seed=3",
        "logger.backend=none",
        "sampling.max_new_tokens=12",
        "env.prompts_per_step=2",
        "env.group_size=4",
        "optimizer.lr=3e-3",
        "policy.kl_coef=0.05",
        "env.max_prompt_tokens=300",
        f"reward.path={reward_file}",
        "reward.name=early_letters",
        "eval.every=0",
        "train.checkpoint_frequency=1",
        # bf16 on every CPU kind: the preset's path where bf16 is fast (bf16 weights, stochastic rounding)
        "train_model.precision=bfloat16",
        "ref_model.precision=bfloat16",
        "inference_model.precision=bfloat16",
        *extra,
    ]


@pytest.fixture(scope="module")
def varied_model_dir(tokenizer_dir, tmp_path_factory) -> Path:
    """A tiny model whose answers vary in their letters, so that the reward varies within groups."""
    from grpo_rl.model.loading import build_tiny_model

    return build_tiny_model(str(tokenizer_dir), tmp_path_factory.mktemp("varied"), initializer_range=1.0)


def test_lowmem_trains_and_resumes_bit_for_bit(varied_model_dir, tmp_path):
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(REWARD_FILE)
    env = script_env(OMP_NUM_THREADS="1")  # the same thread count in every run: bit-equal results

    whole = tmp_path / "whole"
    proc = run_script("grpo.py", *_args(varied_model_dir, reward_file, whole, 4), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "vllm" not in log.lower(), log[-3000:]  # no engine of its own
    a = read_metrics(whole)
    assert [r["step"] for r in a] == [1, 2, 3, 4] and a[-1]["policy_version"] == 4
    assert any(r["grad_norm"] > 0 for r in a), "no step updated the weights: the test would prove nothing"
    assert all(r["weight_sync_seconds"] < 0.05 for r in a)  # nothing is pushed to a shared model
    state = torch.load(whole / "checkpoints" / "step_00000004" / "trainer_state.pt", weights_only=True)
    kinds = {type(v).__name__ for s in state["learner"]["optimizer"]["state"].values() for v in s.values()}
    assert "OptimState8bit" in kinds, kinds
    weights = load_file(whole / "final_model" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}  # train_model.dtype=auto under bf16

    parts = tmp_path / "parts"
    first = run_script("grpo.py", *_args(varied_model_dir, reward_file, parts, 2), env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    rest = run_script("grpo.py", *_args(varied_model_dir, reward_file, parts, 4, "resume=auto"), env=env)
    assert rest.returncode == 0, rest.stderr[-3000:]
    b = read_metrics(parts)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        assert {k: ra[k] for k in COMPARED} == {k: rb[k] for k in COMPARED}, (ra["step"], ra, rb)
    wa, wb = (load_file(d / "final_model" / "model.safetensors") for d in (whole, parts))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
