"""The IFEval task and a custom task (prompt file + user reward functions + a reward model) run end to end.

Each test runs ``sota/grpo.py`` as a subprocess on a tiny random model for two steps and checks what the run
logged: every reward component, the failure count and the failing samples. About 10 s each (the transformers
engine: the tasks are the subject, not the engine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import FLAKY_REWARD, NOT_VLLM

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TINY_RUN = [
    "train.steps=2",
    "logger.backend=none",
    "sampling.max_new_tokens=16",
    "env.prompts_per_step=2",
    "env.group_size=2",
    NOT_VLLM,
]

# FLAKY_REWARD raises on every other call. Each group is scored as it finishes: a group's call that fails is made
# again one answer at a time, and one of those fails too, so one answer of each step falls back and is logged, and
# never all of a step's answers.


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.setdefault("GRPO_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    return env


def _run(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(ROOT / "sota" / "grpo.py"), *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"grpo.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_ifeval_config_runs(tiny_model_dir: Path, tmp_path: Path):
    data = Path(_env()["GRPO_DATA_DIR"]) / "ifeval" / "input_data.jsonl"
    if not data.is_file():
        pytest.skip(f"IFEval prompts not found at {data}")
    _run("--config-name", "grpo_ifeval", f"model.name={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_RUN)
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        parts = {k: m[f"reward_{k}_mean"] for k in ("prompt_strict", "prompt_loose", "inst_strict", "inst_loose")}
        assert all(0.0 <= v <= 1.0 for v in parts.values())
        assert m["reward_mean"] == pytest.approx(parts["inst_strict"], abs=1e-6)  # the YAML's weights
        assert m["reward_failures"] == 0
    assert (tmp_path / "final_model" / "config.json").is_file()


def test_custom_task_with_reward_functions_and_a_reward_model(
    tiny_model_dir: Path, tokenizer_dir: Path, tmp_path: Path
):
    from grpo_rl.envs.rewards.reward_model import build_tiny_reward_model

    rm_dir = build_tiny_reward_model(str(tokenizer_dir), tmp_path / "rm")
    (tmp_path / "flaky.py").write_text(FLAKY_REWARD)
    example = ROOT / "examples" / "custom_reward.py"
    functions = (
        f"reward.functions=[{{path: {example}, name: contains_answer, weight: 1.0}}, "
        f"{{path: {example}, name: brevity, weight: 0.2}}, {{path: {tmp_path / 'flaky.py'}, name: flaky}}]"
    )
    run_dir = tmp_path / "run"
    _run(
        "env.dataset=file",
        "env.path=examples/prompts.jsonl",
        functions,
        "reward.fallback=-1",
        f"reward.model_path={rm_dir}",
        "reward.model_weight=0.5",
        f"model.name={tiny_model_dir}",
        f"output_dir={run_dir}",
        *TINY_RUN,
    )
    metrics = _metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert {"reward_contains_answer_mean", "reward_brevity_mean", "reward_flaky_mean", "reward_model_mean"} <= set(
            m
        )
    # each step, 2 groups of 2: the first group's call (1, then 5) fails, its answers are scored one by one (2 and 3,
    # then 6 and 7: the second fails and gets the fallback, -1); the second group's call (4, then 8) succeeds
    assert [m["reward_failures"] for m in metrics] == [1, 1]
    assert metrics[0]["reward_flaky_mean"] == pytest.approx((-1 + 1 + 1 + 1) / 4)
    failures = [json.loads(line) for line in (run_dir / "reward_failures.jsonl").read_text().splitlines()]
    assert len(failures) == 2 and {f["reward"] for f in failures} == {"flaky"}
    assert [f["step"] for f in failures] == [1, 2]
    assert all("RuntimeError('flaky call" in f["error"] and isinstance(f["response"], str) for f in failures)
