"""What a task is: the :class:`Task` each room registers, read by :func:`grpo_rl.envs.make_env`.

A task is built from its slices of the config, never the whole of it: ``env`` (the ``env`` group, an
:class:`~grpo_rl.config.schema.EnvConfig`) and, for its reward and system prompt, ``reward`` (a
:class:`~grpo_rl.config.schema.RewardConfig`). What every task shares is done once, by ``make_env``: the user's
reward functions and a reward model are added after the task's own components, the tools' paragraph after its system
prompt (``env.system_prompt`` replacing the task's own), and the composed reward and prompt are handed to
:attr:`Task.make_env`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from grpo_rl.config.schema import EnvConfig, RewardConfig
from grpo_rl.envs.base import PromptEnv
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent

if TYPE_CHECKING:
    from grpo_rl.envs.multiturn import ToolUse


class EnvFactory(Protocol):
    """Builds a task's environment over ``records``, scored by ``reward`` (the task's components and the shared ones),
    with ``system_prompt`` (already resolved: ``env.system_prompt`` or the task's own, then the tools') and the
    tools of multi-turn episodes (``tool_use``, None without ``env.tools``)."""

    def __call__(
        self,
        env: EnvConfig,
        records: list[dict],
        tokenizer: Any,
        reward: CompositeReward,
        *,
        seed: int,
        system_prompt: str | None,
        tool_use: ToolUse | None,
    ) -> PromptEnv: ...


def no_column(env: EnvConfig) -> None:
    """The task passes no data column."""
    return None


@dataclass(frozen=True)
class Task:
    """One task: where its prompts come from, its environment, its own reward, its system prompt and its columns."""

    name: str
    """The ``env.dataset`` value that picks it."""
    records: Callable[[EnvConfig, str], list[dict]]
    """``(env, split) -> rows``: the split's data rows (read, downloaded or generated), before any is skipped."""
    make_env: EnvFactory
    """The environment over the rows."""
    reward: Callable[[EnvConfig, RewardConfig, Any], Sequence[RewardComponent]]
    """``(env, reward, tokenizer) -> components``: the task's own reward components (none for a user's file, whose
    reward is the user's functions), in the order they are logged."""
    system_prompt: Callable[[EnvConfig, RewardConfig], str | None]
    """``(env, reward) -> text``: the task's own system prompt, which ``env.system_prompt`` replaces; None: none."""
    prompt_column: Callable[[EnvConfig], str]
    """``env -> column``: the row column holding the raw prompt, which a reward model and TRL-style reward functions
    read."""
    reference_column: Callable[[EnvConfig], str | None] = no_column
    """``env -> column``: the row column user reward functions get as the references (verl's ``ground_truth``,
    passed to TRL's by that name); None: none."""
    success_component: str | None = None
    """The reward component marking an evaluation answer solved (value >= 1; ``eval.success_component`` overrides);
    None: the total reward >= 1."""
    eval_split: str | None = None
    """The held-out split evaluation reads by default (``eval.split`` overrides); None: ``env.split``."""
