"""GSM8K (Cobbe et al., 2021): grade-school math word problems with a numeric final answer.

The room holds the environment, the prompt templates and the system prompts (:mod:`.env`), and the answer
extraction and rule-based rewards (:mod:`.reward`). Held-out evaluation reads the test split, and an answer is
solved when its ``correct`` component is 1.
"""

from __future__ import annotations

from grpo_rl.envs.tasks.gsm8k.env import PROMPT_COLUMN, gsm8k_records, gsm8k_reward, gsm8k_system_prompt, make_gsm8k_env
from grpo_rl.envs.tasks.task import Task

TASK = Task(
    name="gsm8k",
    records=gsm8k_records,
    make_env=make_gsm8k_env,
    reward=gsm8k_reward,
    system_prompt=gsm8k_system_prompt,
    prompt_column=lambda env: PROMPT_COLUMN,
    success_component="correct",
    eval_split="test",
)
