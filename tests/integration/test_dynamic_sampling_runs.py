"""DAPO's dynamic sampling in both scripts on the tiny model: extra batches are drawn from the stream in order,
every step trains on env.prompts_per_step varied groups when the rewards allow, and the bound holds when they
never vary."""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import NOT_VLLM, assert_groups_trained_once, read_metrics, run_script, tiny_overrides
from tests.unit.helpers import write_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Rewards that vary within most groups (answer length parity), and rewards that never vary.
REWARDS = """
def parity(responses, references):
    return [float(len(r) % 2) for r in responses]

def constant(responses, references):
    return [1.0 for _ in responses]
"""


def task(tmp_path, name: str) -> list[str]:
    data = write_jsonl(
        tmp_path / "prompts.jsonl", [{"prompt": f"Say something about {i}.", "ground_truth": ""} for i in range(40)]
    )
    (tmp_path / "rewards.py").write_text(REWARDS)
    return [
        "env.dataset=file",
        f"env.path={data}",
        f"reward.path={tmp_path / 'rewards.py'}",
        f"reward.name={name}",
        "eval.every=0",
        "policy.dynamic_sampling=true",
        NOT_VLLM,
    ]


def trained(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("script", ["grpo.py", "grpo-async.py"])
def test_steps_train_on_varied_groups_drawn_in_stream_order(script, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = run_script(
        script,
        *tiny_overrides(tiny_model_dir, out, steps=3),
        *task(tmp_path, "parity"),
        "policy.dynamic_sampling_max_rounds=4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        # the bound holds a step's own draws; in the asynchronous loop the collectors draw on while the learner
        # trains, and every group dropped meanwhile counts for the next step
        assert 1 <= r["sampling_rounds"] and (r["sampling_rounds"] <= 5 or script == "grpo-async.py")
        assert r["dynamic_sampling_groups"] == 2 or r["dynamic_sampling_short"] == 1
        assert r["zero_variance_groups"] == 0 or r["dynamic_sampling_groups"] == 0  # flat groups never trained
    indices = assert_groups_trained_once(out)  # each group once, the flat ones consumed
    if script == "grpo.py":  # one loop, one stream: the groups of all steps, drawn in turn, trained in stream order
        assert indices == sorted(indices)
        assert sum(r["sampling_rounds"] for r in rows) * 2 >= max(indices) + 1


def test_rewards_that_never_vary_stop_at_the_bound_and_skip_the_update(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = run_script(
        "grpo.py",
        *tiny_overrides(tiny_model_dir, out, steps=2),
        *task(tmp_path, "constant"),
        "policy.dynamic_sampling_max_rounds=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["sampling_rounds"] for r in rows] == [3, 3]
    assert [r["dynamic_sampling_short"] for r in rows] == [1, 1]
    assert rows[-1]["policy_version"] == 0  # nothing to train on: no update
    assert rows[-1]["reward_mean"] == 1.0
