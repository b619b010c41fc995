"""The arithmetic environment: ``env.arithmetic``'s generated problems (:mod:`.problems`) in GSM8K's environment,
with its templates (``env.template``) and its reward."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_rl.config.schema import EnvConfig
from grpo_rl.envs.base import PromptEnv
from grpo_rl.envs.rewards.base import CompositeReward
from grpo_rl.envs.tasks.arithmetic.problems import ArithmeticSpec, arithmetic_records
from grpo_rl.envs.tasks.gsm8k.env import make_gsm8k_env

if TYPE_CHECKING:
    from grpo_rl.envs.multiturn import ToolUse


def arithmetic_split(env: EnvConfig, split: str) -> list[dict]:
    """The problems of ``split``: ``env.arithmetic.train_size`` or ``test_size`` of them, from
    ``env.arithmetic.seed``."""
    arithmetic = env.arithmetic
    size = arithmetic.train_size if split == "train" else arithmetic.test_size
    return arithmetic_records(split, seed=arithmetic.seed, size=size, spec=ArithmeticSpec.from_config(arithmetic))


def make_arithmetic_env(
    env: EnvConfig,
    records: list[dict],
    tokenizer: Any,
    reward: CompositeReward,
    *,
    seed: int,
    system_prompt: str | None,
    tool_use: ToolUse | None = None,
) -> PromptEnv:
    """GSM8K's environment over the generated problems, named ``arithmetic``."""
    return make_gsm8k_env(
        env, records, tokenizer, reward, seed=seed, system_prompt=system_prompt, tool_use=tool_use, name="arithmetic"
    )
