"""IFEval (Zhou et al., 2023): 541 prompts with verifiable formatting instructions, as a training environment.

Each prompt is sent as the user message as is, the way the benchmark is run; the reward is a weighted mix of
the benchmark's strict/loose, prompt-/instruction-level scores (:mod:`grpo_rl.envs.tasks.ifeval.reward`).
Departures from the benchmark:

* IFEval is an evaluation set, and training on it measures how well a policy can learn to follow these
  instructions, not how well it generalises to unseen ones: evaluate on held-out instructions for that.
* With ``reward.ifeval_answer_tags`` a system prompt asks for the answer inside ``<answer>...</answer>`` and
  only that text is checked.
* The two prompts whose ``keywords:letter_frequency`` names ``#`` or ``!`` are scored on that symbol, where the
  reference checker counts a random letter (:mod:`grpo_rl.envs.tasks.ifeval.instructions.checkers_keywords`).

GSM8K's ``env.template`` (hash | tags) means nothing here and is ignored; ``env.system_prompt`` still applies.
The row's ``prompt`` is also passed to every reward as a keyword column (a reward model reads it).
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Sequence

from grpo_rl.envs.base import PromptEnv
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.envs.tasks.ifeval.reward import ifeval_components

log = logging.getLogger(__name__)

ANSWER_TAGS_SYSTEM_PROMPT = (
    "You are a helpful assistant that follows instructions exactly. You may plan your reply first. Then write "
    "the reply itself, and nothing else, inside <answer> </answer> tags; only the text inside the tags is read."
)


def ifeval_messages(row: dict, *, system_prompt: str | None = None) -> list[dict]:
    """The chat messages for one IFEval row: an optional system prompt and the prompt as the user turn."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": row["prompt"]}]


def ifeval_reference(row: dict) -> dict:
    """What the IFEval reward needs about a row: its instructions, their arguments and the prompt."""
    return {"instruction_id_list": list(row["instruction_id_list"]), "kwargs": list(row["kwargs"]),
            "prompt": row["prompt"]}


def make_ifeval_env(cfg, records: list[dict], tokenizer, *, seed: int,
                    extra_components: Sequence[RewardComponent] = ()) -> PromptEnv:
    """Build the IFEval environment from the ``env`` and ``reward`` config groups.

    Args:
        cfg: the run config.
        records: IFEval rows (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``).
        tokenizer: the policy's tokenizer.
        seed: prompt-order seed.
        extra_components: more reward components (user functions, a reward model) added to the IFEval ones.
    """
    answer_tags = cfg.reward.ifeval_answer_tags
    if cfg.env.template == "tags" and not answer_tags:
        log.warning("env.template=tags is a GSM8K setting and is ignored by IFEval; "
                    "set reward.ifeval_answer_tags=true to ask for <answer> tags")
    system_prompt = cfg.env.system_prompt or (ANSWER_TAGS_SYSTEM_PROMPT if answer_tags else None)
    components = ifeval_components(dict(cfg.reward.ifeval_weights), answer_tags=answer_tags,
                                   format_weight=cfg.reward.format_weight)
    return PromptEnv(
        records,
        tokenizer,
        CompositeReward([*components, *extra_components], fallback=cfg.reward.fallback),
        format_messages=partial(ifeval_messages, system_prompt=system_prompt),
        reference_of=ifeval_reference,
        prompts_per_step=cfg.env.prompts_per_step,
        max_prompt_tokens=cfg.env.max_prompt_tokens,
        seed=seed,
        shuffle=cfg.env.shuffle,
        too_long=cfg.env.too_long_prompts,
        extra_columns=("prompt",),
        name="ifeval",
    )
