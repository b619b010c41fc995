"""What both workers of ``versus_trl/trl_compare.py`` share: the workload, the reward, and the line protocol.

This file is imported by the TRL worker too, which runs in ``benchmarks/.venv-trl`` without grpo_rl's
dependencies: it uses the standard library only, and loads grpo_rl's GSM8K reward module (plain ``re`` and
``fractions``) straight from its file.
"""

from __future__ import annotations

import importlib.util
import json
import sys

from benchmarks.common import ROOT

# The workload both sides run.
WORKLOAD = dict(
    model="embedded:smollm2-135m-instruct",
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=64,
    temperature=1.0,
    kl_coef=0.04,
    lr=1e-6,
    seed=0,
)

# Reward weights, the same on both sides: GSM8K correctness, the '#### N' format, and brevity.
REWARD_WEIGHTS = {"correct": 1.0, "format": 0.5, "brevity": 0.25}
BREVITY_CHARS = 400

MARK = "@@BENCH "


def _gsm8k_module():
    path = ROOT / "grpo_rl" / "envs" / "tasks" / "gsm8k" / "reward.py"
    spec = importlib.util.spec_from_file_location("_gsm8k_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_GSM8K = _gsm8k_module()


def correct(responses, references, **_):
    """1 when the final answer equals the reference (grpo_rl.envs.tasks.gsm8k.reward.correctness_reward)."""
    return _GSM8K.correctness_reward(list(responses), list(references))


def format_(responses, references, **_):
    """1 / 0.5 / 0 for the '#### N' last line (grpo_rl.envs.tasks.gsm8k.reward.format_reward)."""
    return _GSM8K.format_reward(list(responses), list(references), template="hash")


def brevity(responses, references=None, **_):
    """``1 - len/400`` characters, clipped at 0: a graded length component that every group varies in.

    A 135M model rarely answers GSM8K right within 64 tokens, so correctness and format alone leave most groups
    with equal rewards and zero advantages; this term makes every step's gradient non-zero on both sides.
    """
    return [max(0.0, 1.0 - len(r) / BREVITY_CHARS) for r in responses]


def emit(event: str, **fields) -> None:
    """One protocol line on stdout (library logging may share stdout; the orchestrator keeps only these)."""
    sys.stdout.write(MARK + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def wait_for_command() -> str:
    """Block until the orchestrator sends a command line ('step' or 'quit')."""
    line = sys.stdin.readline()
    return line.strip() or "quit"
