"""Generated arithmetic problems: a task a 135M model can visibly learn on a CPU within minutes.

GSM8K is nearly out of reach of SmolLM2-135M-Instruct (a few percent greedy accuracy), so a short CPU run shows
little. Problems such as ``What is 47 + 38?`` are generated from a seed instead (:mod:`.problems`), in GSM8K's
record layout, and served by GSM8K's environment with its templates, system prompts and reward (:mod:`.env`).
Held-out evaluation reads the test split, and an answer is solved when its ``correct`` component is 1.
"""

from __future__ import annotations

from grpo_rl.envs.tasks.arithmetic.env import arithmetic_split, make_arithmetic_env
from grpo_rl.envs.tasks.gsm8k.env import PROMPT_COLUMN, gsm8k_reward, gsm8k_system_prompt
from grpo_rl.envs.tasks.task import Task

TASK = Task(
    name="arithmetic",
    records=arithmetic_split,
    make_env=make_arithmetic_env,
    reward=gsm8k_reward,
    system_prompt=gsm8k_system_prompt,
    prompt_column=lambda env: PROMPT_COLUMN,
    success_component="correct",
    eval_split="test",
)
