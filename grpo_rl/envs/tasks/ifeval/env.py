"""IFEval's environment: each prompt sent as the user message as is, the way the benchmark is run, scored by a
weighted mix of the benchmark's strict/loose, prompt-/instruction-level scores (:mod:`.reward`).

GSM8K's ``env.template`` (hash | tags) means nothing here and is ignored; ``env.system_prompt`` still applies.
The row's ``prompt`` is also passed to every reward as a keyword column (a reward model reads it).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from grpo_rl.config.schema import EnvConfig, RewardConfig
from grpo_rl.envs.base import PromptEnv
from grpo_rl.envs.data import load_records
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent

if TYPE_CHECKING:
    from grpo_rl.envs.multiturn import ToolUse

log = logging.getLogger(__name__)

PROMPT_COLUMN = "prompt"
"""The row column holding the prompt."""

ANSWER_TAGS_SYSTEM_PROMPT = (
    "You are a helpful assistant that follows instructions exactly. You may plan your reply first. Then write "
    "the reply itself, and nothing else, inside <answer> </answer> tags; only the text inside the tags is read."
)


def ifeval_messages(row: dict, *, system_prompt: str | None = None) -> list[dict]:
    """The chat messages for one IFEval row: an optional system prompt and the prompt as the user turn."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": row[PROMPT_COLUMN]}]


def ifeval_reference(row: dict) -> dict:
    """What the IFEval reward needs about a row: its instructions, their arguments and the prompt."""
    return {
        "instruction_id_list": list(row["instruction_id_list"]),
        "kwargs": list(row["kwargs"]),
        "prompt": row["prompt"],
    }


def ifeval_system_prompt(env: EnvConfig, reward: RewardConfig) -> str | None:
    """With ``reward.ifeval_answer_tags``, the request for the answer inside ``<answer>`` tags; else none."""
    return ANSWER_TAGS_SYSTEM_PROMPT if reward.ifeval_answer_tags else None


def ifeval_reward(env: EnvConfig, reward: RewardConfig, tokenizer) -> list[RewardComponent]:
    """IFEval's components as ``reward.ifeval_weights`` weighs them, and with ``reward.ifeval_answer_tags`` the
    tags' ``format`` component (``reward.format_weight``)."""
    # The checkers import nltk: loaded when an IFEval reward is built, not by every run that imports the tasks.
    from grpo_rl.envs.tasks.ifeval.reward import ifeval_components

    answer_tags = reward.ifeval_answer_tags
    if env.template == "tags" and not answer_tags:
        log.warning(
            "env.template=tags is a GSM8K setting and is ignored by IFEval; "
            "set reward.ifeval_answer_tags=true to ask for <answer> tags"
        )
    return ifeval_components(dict(reward.ifeval_weights), answer_tags=answer_tags, format_weight=reward.format_weight)


def ifeval_records(env: EnvConfig, split: str) -> list[dict]:
    """IFEval's prompts (``env.path``, else the shared data folder, else the hub; it has only its 541)."""
    return load_records("ifeval", split=split, path=env.path)


def make_ifeval_env(
    env: EnvConfig,
    records: list[dict],
    tokenizer: Any,
    reward: CompositeReward,
    *,
    seed: int,
    system_prompt: str | None,
    tool_use: ToolUse | None = None,
) -> PromptEnv:
    """The IFEval environment over ``records`` (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``), each
    prompt after ``system_prompt`` when there is one."""
    return PromptEnv(
        records,
        tokenizer,
        reward,
        format_messages=partial(ifeval_messages, system_prompt=system_prompt),
        reference_of=ifeval_reference,
        prompts_per_step=env.prompts_per_step,
        max_prompt_tokens=env.max_prompt_tokens,
        seed=seed,
        shuffle=env.shuffle,
        too_long=env.too_long_prompts,
        extra_columns=(PROMPT_COLUMN,),
        tool_use=tool_use,
        name="ifeval",
    )
