"""IFEval (Zhou et al., 2023): 541 prompts with verifiable formatting instructions, as a training environment.

The room holds the environment and the answer-tags system prompt (:mod:`.env`), the reward components
(:mod:`.reward`) and the benchmark's instruction checkers, offline (:mod:`.instructions`). Departures from the
benchmark:

* IFEval is an evaluation set, and training on it measures how well a policy can learn to follow these
  instructions, not how well it generalises to unseen ones: evaluate on held-out instructions for that.
* With ``reward.ifeval_answer_tags`` a system prompt asks for the answer inside ``<answer>...</answer>`` and
  only that text is checked.
* The two prompts whose ``keywords:letter_frequency`` names ``#`` or ``!`` are scored on that symbol, where the
  reference checker counts a random letter (:mod:`.instructions.checkers_keywords`).

Held-out evaluation reads the same 541 prompts (``train``, the only split), and an answer is solved when its
``prompt_strict`` component, the benchmark's headline metric, is 1.
"""

from __future__ import annotations

from grpo_rl.envs.tasks.ifeval.env import (
    PROMPT_COLUMN,
    ifeval_records,
    ifeval_reward,
    ifeval_system_prompt,
    make_ifeval_env,
)
from grpo_rl.envs.tasks.task import Task

TASK = Task(
    name="ifeval",
    records=ifeval_records,
    make_env=make_ifeval_env,
    reward=ifeval_reward,
    system_prompt=ifeval_system_prompt,
    prompt_column=lambda env: PROMPT_COLUMN,
    success_component="prompt_strict",
    eval_split="train",
)
