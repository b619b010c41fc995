"""The tasks, one room each, and the registry ``env.dataset`` is looked up in.

=============  ==================================================================================================
env.dataset    room
=============  ==================================================================================================
``gsm8k``      :mod:`.gsm8k`: GSM8K's word problems, its two prompt templates, answer extraction and rewards
``ifeval``     :mod:`.ifeval`: IFEval's prompts, the answer-tags system prompt, the benchmark's checkers as rewards
``arithmetic`` :mod:`.arithmetic`: generated problems, served and scored as GSM8K's
``file``       :mod:`.file`: a user's prompts from files or a hub data set, scored by the user's reward functions
=============  ==================================================================================================

Each room registers a :class:`~grpo_rl.envs.tasks.task.Task` (its ``TASK``) in :data:`TASKS`: where its prompts
come from, its environment, its own reward, its system prompt and its columns. A new task is a room of its own, its
``TASK`` added here and its name to ``env.dataset``'s choices (:data:`grpo_rl.config.schema.DATASETS`).
"""

from __future__ import annotations

from grpo_rl.config.schema import EnvConfig, RewardConfig
from grpo_rl.envs.tasks import arithmetic, file, gsm8k, ifeval
from grpo_rl.envs.tasks.task import Task
from grpo_rl.envs.tools.configured import configured_tools
from grpo_rl.envs.tools.format import tool_system_prompt

TASKS: dict[str, Task] = {task.name: task for task in (gsm8k.TASK, ifeval.TASK, arithmetic.TASK, file.TASK)}
"""``env.dataset`` -> its task."""


def task_of(dataset: str) -> Task:
    """The task ``env.dataset`` names; raises ValueError for no task of that name."""
    if dataset not in TASKS:
        *others, last = TASKS
        raise ValueError(f"env.dataset={dataset!r} is not supported; choose {', '.join(others)} or {last}")
    return TASKS[dataset]


def system_prompt(env: EnvConfig, reward: RewardConfig) -> str | None:
    """The system prompt of the run's prompts, a function of the config alone: ``env.system_prompt``, else the
    task's own, then, with ``env.tools``, the tools' descriptions and call format.

    Raises:
        ConfigError: a tool of ``env.tools`` cannot be loaded.
    """
    own = env.system_prompt or task_of(env.dataset).system_prompt(env, reward)
    if not env.tools:
        return own
    tools = configured_tools(env.tools)  # the files were imported once (cached), when the config was checked
    return "\n\n".join(p for p in (own, tool_system_prompt(list(tools.values()))) if p)


__all__ = ["TASKS", "Task", "system_prompt", "task_of"]
