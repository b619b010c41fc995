"""GSM8K (Cobbe et al., 2021): grade-school math word problems with a numeric final answer.

Two prompt templates:

* ``hash`` (default, GSM8K's own solution format): reason step by step, then the final answer on the last
  line as ``#### N``.
* ``tags`` (DeepSeek-R1 style): reasoning inside ``<think>...</think>``, answer inside ``<answer>N</answer>``.

The reward is correctness (the extracted final answer equals the reference) plus a weighted, partial format
reward. A 135M model rarely gets a GSM8K answer right, so a pure 0/1 reward gives it almost no signal; the
format component varies within groups and is what a small model learns first.
"""
from __future__ import annotations

from functools import partial

from grpo_rl.envs.base import PromptEnv
from grpo_rl.rewards.base import CompositeReward, RewardComponent
from grpo_rl.rewards.gsm8k import correctness_reward, format_reward, reference_answer

SYSTEM_PROMPTS = {
    "hash": (
        "You are a careful math tutor. Solve the problem step by step in a few short sentences. "
        "Then write the final answer, a single number, on the last line in the form '#### <number>'."
    ),
    "tags": (
        "You are a careful math tutor. Think through the problem inside <think> </think> tags, then give the "
        "final answer, a single number, inside <answer> </answer> tags."
    ),
}


def gsm8k_messages(row: dict, *, template: str, system_prompt: str | None = None) -> list[dict]:
    return [
        {"role": "system", "content": system_prompt or SYSTEM_PROMPTS[template]},
        {"role": "user", "content": row["question"]},
    ]


def gsm8k_reward(template: str, correctness_weight: float, format_weight: float, last_number_fallback: bool) -> CompositeReward:
    components = [
        RewardComponent("correct", partial(correctness_reward, last_number_fallback=last_number_fallback), correctness_weight)
    ]
    if format_weight:
        components.append(RewardComponent("format", partial(format_reward, template=template), format_weight))
    return CompositeReward(components)


def make_gsm8k_env(cfg, records: list[dict], tokenizer, *, seed: int) -> PromptEnv:
    """Build the GSM8K environment from the ``env`` and ``reward`` config groups."""
    return PromptEnv(
        records,
        tokenizer,
        gsm8k_reward(cfg.env.template, cfg.reward.correctness_weight, cfg.reward.format_weight, cfg.reward.last_number_fallback),
        format_messages=partial(gsm8k_messages, template=cfg.env.template, system_prompt=cfg.env.system_prompt),
        reference_of=lambda row: reference_answer(row["answer"]),
        prompts_per_step=cfg.env.prompts_per_step,
        max_prompt_tokens=cfg.env.max_prompt_tokens,
        seed=seed,
        shuffle=cfg.env.shuffle,
        too_long=cfg.env.too_long_prompts,
        name="gsm8k",
    )
