"""GSM8K's environment: the rows of a split, its two prompt templates and its reward.

Two prompt templates (``env.template``):

* ``hash`` (default, GSM8K's own solution format): reason step by step, then the final answer on the last
  line as ``#### N``.
* ``tags`` (DeepSeek-R1 style): reasoning inside ``<think>...</think>``, answer inside ``<answer>N</answer>``.

The reward (:mod:`.reward`) is correctness (the extracted final answer equals the reference) plus a weighted,
partial format reward, and with ``tags`` optionally a thinking component (``reward.thinking_weight``: a ``<think>``
section of at least ``reward.min_thinking_tokens`` tokens). A 135M model rarely gets a GSM8K answer right, so a pure
0/1 reward gives it almost no signal; the format component varies within groups and is what a small model learns
first. The arithmetic task (:mod:`grpo_rl.envs.tasks.arithmetic`) serves its generated problems through this
environment.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from grpo_rl.config.schema import EnvConfig, RewardConfig
from grpo_rl.envs.base import PromptEnv
from grpo_rl.envs.data import load_records
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.envs.tasks.gsm8k.reward import (
    TokenCounter,
    correctness_reward,
    format_reward,
    reference_answer,
    thinking_reward,
)

if TYPE_CHECKING:
    from grpo_rl.envs.multiturn import ToolUse

PROMPT_COLUMN = "question"
"""The row column holding the problem."""

# The hash prompt carries one worked example: with it, 17% of SmolLM2-135M-Instruct's answers use the
# '#### N' format before any training (9% exactly as asked), against 2% with the instruction alone
# (8 GSM8K train prompts x 8 samples, temperature 1.0), which gives the format reward something to work with.
SYSTEM_PROMPTS = {
    "hash": (
        "Solve the math problem briefly, then give the final answer on the last line as '#### <number>'.\n"
        "Example:\n"
        "Question: Tom has 3 apples and buys 2 more. How many apples does he have?\n"
        "Answer: Tom has 3 + 2 = 5 apples.\n"
        "#### 5"
    ),
    "tags": (
        "Think through the math problem inside <think> </think> tags, then give the final answer, a single "
        "number, inside <answer> </answer> tags.\n"
        "Example:\n"
        "Question: Tom has 3 apples and buys 2 more. How many apples does he have?\n"
        "<think>Tom has 3 + 2 = 5 apples.</think>\n"
        "<answer>5</answer>"
    ),
}


def gsm8k_system_prompt(env: EnvConfig, reward: RewardConfig) -> str:
    """The system prompt of ``env.template``."""
    return SYSTEM_PROMPTS[env.template]


def gsm8k_messages(row: dict, *, template: str, system_prompt: str | None = None) -> list[dict]:
    return [
        {"role": "system", "content": system_prompt or SYSTEM_PROMPTS[template]},
        {"role": "user", "content": row[PROMPT_COLUMN]},
    ]


def gsm8k_components(
    template: str,
    correctness_weight: float,
    format_weight: float,
    last_number_fallback: bool,
    *,
    thinking_weight: float = 0.0,
    min_thinking_tokens: int = 0,
    tokenizer=None,
) -> list[RewardComponent]:
    """GSM8K's reward components: ``correct``, ``format`` (when ``format_weight``) and, with the ``tags`` template,
    ``thinking`` (when ``thinking_weight``; its tokens are counted with ``tokenizer``)."""
    components = [
        RewardComponent(
            "correct", partial(correctness_reward, last_number_fallback=last_number_fallback), correctness_weight
        )
    ]
    if format_weight:
        components.append(RewardComponent("format", partial(format_reward, template=template), format_weight))
    if thinking_weight:
        if template != "tags" or tokenizer is None:
            raise ValueError(
                "the thinking reward scores the <think> section of the tags template; it needs "
                "template='tags' and the policy's tokenizer"
            )
        scorer = partial(thinking_reward, count_tokens=TokenCounter(tokenizer), min_tokens=min_thinking_tokens)
        components.append(RewardComponent("thinking", scorer, thinking_weight))
    return components


def gsm8k_reward(env: EnvConfig, reward: RewardConfig, tokenizer) -> list[RewardComponent]:
    """GSM8K's components as the ``reward`` group weighs them, for ``env.template``."""
    return gsm8k_components(
        env.template,
        reward.correctness_weight,
        reward.format_weight,
        reward.last_number_fallback,
        thinking_weight=reward.thinking_weight,
        min_thinking_tokens=reward.min_thinking_tokens,
        tokenizer=tokenizer,
    )


def gsm8k_records(env: EnvConfig, split: str) -> list[dict]:
    """The rows of GSM8K's ``split`` (``env.path``, else the shared data folder, else the hub)."""
    return load_records("gsm8k", split=split, path=env.path)


def make_gsm8k_env(
    env: EnvConfig,
    records: list[dict],
    tokenizer: Any,
    reward: CompositeReward,
    *,
    seed: int,
    system_prompt: str | None,
    tool_use: ToolUse | None = None,
    name: str = "gsm8k",
) -> PromptEnv:
    """The GSM8K environment over ``records`` (GSM8K's layout: ``question``, ``answer``): each question after
    ``system_prompt`` (None: ``env.template``'s), scored by ``reward`` against the answer's final number."""
    return PromptEnv(
        records,
        tokenizer,
        reward,
        format_messages=partial(gsm8k_messages, template=env.template, system_prompt=system_prompt),
        reference_of=lambda row: reference_answer(row["answer"]),
        prompts_per_step=env.prompts_per_step,
        max_prompt_tokens=env.max_prompt_tokens,
        seed=seed,
        shuffle=env.shuffle,
        too_long=env.too_long_prompts,
        tool_use=tool_use,
        name=name,
    )
