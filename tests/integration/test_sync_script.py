"""sota/grpo.py end to end on a tiny model with the vLLM engine, and its start-up errors on bad input."""

from __future__ import annotations

import pytest

from tests.integration.helpers import (
    NOT_VLLM,
    SHARED_STEP_METRICS,
    read_metrics,
    run_script,
    start_up_noise,
    tiny_overrides,
)

pytestmark = [pytest.mark.integration]

STEP_KEYS = {"reward_correct_mean", "reward_format_mean", *SHARED_STEP_METRICS}


@pytest.mark.slow
def test_sync_script_runs_steps(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = run_script("grpo.py", *tiny_overrides(tiny_model_dir, out, steps=2), "eval.every=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert "eval/accuracy" in rows[-1] and "eval/accuracy" not in rows[0]  # the default script evaluates at the end
    missing = STEP_KEYS - set(rows[0])
    assert not missing, f"metrics lack {missing}"
    assert rows[-1]["policy_version"] == 2
    assert (out / "checkpoints" / "step_00000002" / "model" / "config.json").exists()
    assert (out / "final_model" / "model.safetensors").exists()
    assert "reward: start" in proc.stdout and str(out) in proc.stdout
    assert start_up_noise(proc) == []  # a quiet start: the banner, the data lines and torch's NUMA note only


@pytest.mark.slow
def test_compiled_run_trains_and_its_resume_compiles_again(tiny_model_dir, tmp_path):
    """train.compile=true end to end: the learner and the reference compile, the run trains; a resumed run
    (train.compile=auto, which alone would stay eager on a tiny model) compiles from the checkpointed decision."""
    out = tmp_path / "run"
    proc = run_script(
        "grpo.py",
        *tiny_overrides(tiny_model_dir, out, steps=2),
        "train.compile=true",
        "train.checkpoint_frequency=1",
        NOT_VLLM,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "the learner's 2 decoder layers compile" in log and "the reference's 2 decoder layers compile" in log, log[
        -3000:
    ]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["policy_version"] == 2  # both optimizer steps taken
    more = run_script(
        "grpo.py", *tiny_overrides(tiny_model_dir, out, steps=3), "train.compile=auto", "resume=auto", NOT_VLLM
    )
    assert more.returncode == 0, more.stderr[-3000:]
    assert "the learner's 2 decoder layers compile" in more.stdout + more.stderr
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model.name=meta-llama/Llama-2-7b-hf"], "cannot be loaded"),
        (["train_model.devices=[0,1]", "ref_model.devices=[2,3]", "inference_model.devices=[4,5]"], "names GPUs"),
        (["train_model.num_devices=2", "ref_model.num_devices=2", "inference_model.num_devices=2"], "CPU cores"),
        (["optimizer.lrr=1e-5"], "lrr"),
        (["policy.aggregation=mean"], "policy.aggregation"),
        (["env.path=/nonexistent/gsm8k"], "/nonexistent/gsm8k"),
    ],
)
def test_bad_input_fails_fast_with_a_clear_error(overrides, expected, tmp_path):
    proc = run_script("grpo.py", f"output_dir={tmp_path}", "logger.backend=none", *overrides, timeout=120)
    assert proc.returncode == 2, (proc.stderr + proc.stdout)[-2000:]  # a user error, not a crash
    assert expected in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
