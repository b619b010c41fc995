"""``env.dataset=file``: a user's own task, prompts from local files or a Hugging Face data set (:mod:`.env`), scored
by the user's reward functions and a reward model, which any task can add (:mod:`grpo_rl.envs.rewards.custom`).

Its columns are the user's to name: ``env.prompt_column`` holds the prompt, ``env.ground_truth_column`` the
references. It has no system prompt of its own and no held-out split of its own (evaluation reads ``env.split``
unless ``eval.split`` names another), and an evaluation answer is solved when its total reward is at least 1.
See docs/custom_tasks.md.
"""

from __future__ import annotations

from grpo_rl.envs.tasks.file.env import file_reward, file_system_prompt, load_file_records, make_file_env
from grpo_rl.envs.tasks.task import Task

TASK = Task(
    name="file",
    records=load_file_records,
    make_env=make_file_env,
    reward=file_reward,
    system_prompt=file_system_prompt,
    prompt_column=lambda env: env.prompt_column,
    reference_column=lambda env: env.ground_truth_column,
)
