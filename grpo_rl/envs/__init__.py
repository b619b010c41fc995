"""Environments: a prompt data set, a chat template and a reward, as torchrl environments (:mod:`.base`).

``env.dataset`` picks the task, a room of :mod:`.tasks` registered in :data:`~grpo_rl.envs.tasks.TASKS`: ``gsm8k``,
``ifeval``, ``arithmetic`` (generated problems scored as GSM8K) or ``file`` (a user's prompts). Any task's own
reward can be extended with the user's reward functions (``reward.path``/``reward.name``, ``reward.functions``) and
a reward model (``reward.model_path``); all components are summed with their weights and logged one by one, and the
sum is shifted and scaled, ``(sum + reward.bias) * reward.scale``, before advantages.

The package holds the tasks (:mod:`.tasks`) and what they share: the environment (:mod:`.base`), data loading
(:mod:`.data`), reward base classes, user reward functions and a reward model (:mod:`.rewards`), tools
(:mod:`.tools`) and multi-turn episodes (:mod:`.multiturn`). May import :mod:`grpo_rl.engines` and below (an
episode drives an engine through its protocol).
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo_rl.envs.base import PromptEnv, PromptTooLongError, group_answers, rewards_per_answer
from grpo_rl.envs.rewards.base import CompositeReward, RewardComponent
from grpo_rl.envs.rewards.custom import RewardFunction, UserReward, user_reward_components
from grpo_rl.envs.tasks import system_prompt, task_of
from grpo_rl.errors import ConfigError


def make_env(
    cfg,
    tokenizer,
    *,
    split: str | None = None,
    devices=None,
    fewer_prompts_ok: bool = False,
    rewards: Sequence[RewardFunction] = (),
    records: Sequence[dict] | None = None,
) -> PromptEnv:
    """Build the environment of the task ``cfg.env.dataset`` names (:func:`~grpo_rl.envs.tasks.task_of`): its
    prompts with :func:`~grpo_rl.envs.tasks.system_prompt`, its own reward components then the shared ones
    (:func:`shared_reward_components`), and with ``env.tools`` a ``tool_use`` for multi-turn episodes.

    Args:
        split: data split (default ``cfg.env.split``).
        devices: the run's :class:`~grpo_rl.placement.devices.DeviceAllocation`; a reward model runs on its
            ``reward_model`` device. Default: the CPU.
        fewer_prompts_ok: serve every prompt per step when the data has fewer than ``env.prompts_per_step``
            (held-out evaluation); by default that is an error, since a step would repeat prompts.
        rewards: reward functions given as Python objects (the Python API's ``rewards``), added to the configured
            ones.
        records: rows in the task's layout to serve instead of its data (tests, notebooks).

    Raises:
        ConfigError: ``env.prompts_per_step`` exceeds the prompts left after skipping over-long ones (unless
            ``fewer_prompts_ok``), a reward function needs a column the data lacks, or the tokenizer's chat template
            cannot render a tool message (with ``env.tools``).
    """
    task = task_of(cfg.env.dataset)
    split = split or cfg.env.split
    tool_use = _tool_use(cfg.env, tokenizer, cfg.model.name) if cfg.env.tools else None
    shared = shared_reward_components(cfg, devices, rewards)
    rows = list(records) if records is not None else task.records(cfg.env, split)
    reward = CompositeReward(
        [*task.reward(cfg.env, cfg.reward, tokenizer), *shared],
        fallback=cfg.reward.fallback,
        scale=cfg.reward.scale,
        bias=cfg.reward.bias,
    )
    env = task.make_env(
        cfg.env,
        rows,
        tokenizer,
        reward,
        seed=cfg.seed,
        system_prompt=system_prompt(cfg.env, cfg.reward),
        tool_use=tool_use,
    )
    for comp in env.reward.components:
        if isinstance(comp.fn, UserReward):
            comp.fn.check_columns(env.extra_columns)
    names = [c.name for c in env.reward.components]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(
            f"reward components {clashes} would be logged under the same name; give your reward "
            "functions distinct labels (reward.functions=[{path: ..., name: ..., label: ...}])"
        )
    if env.prompts_per_step > len(env):
        if not fewer_prompts_ok:
            skipped = (
                f" ({env.num_skipped} more were skipped as longer than env.max_prompt_tokens="
                f"{cfg.env.max_prompt_tokens})"
                if env.num_skipped
                else ""
            )
            raise ConfigError(
                f"env.prompts_per_step={env.prompts_per_step} is more than the {len(env)} prompts in "
                f"{env.name}{skipped}, so every step would repeat prompts; set env.prompts_per_step to "
                f"at most {len(env)}, or add prompts to the data"
            )
        env.prompts_per_step = len(env)
    return env


def _tool_use(env, tokenizer, model_name: str):
    """The tools of ``env.tools``, answering calls with replies of at most ``env.tool_reply_chars`` characters;
    raises :class:`ConfigError` (before any engine) when the chat template cannot render a tool message."""
    from grpo_rl.envs.multiturn import ToolMessages, ToolUse
    from grpo_rl.envs.tools.configured import configured_tools

    try:
        ToolMessages(tokenizer)
    except ValueError as e:
        raise ConfigError(
            f"env.tools: {e} (model.name={model_name}); use a model whose chat template has a tool "
            "role, or train without env.tools"
        ) from e
    return ToolUse(configured_tools(env.tools), max_chars=env.tool_reply_chars)


def shared_reward_components(cfg, devices=None, rewards: Sequence[RewardFunction] = ()) -> list[RewardComponent]:
    """The components any task can add: the user's reward functions (files, then ``rewards``) and a reward
    model."""
    task = task_of(cfg.env.dataset)
    prompt_column, reference_column = task.prompt_column(cfg.env), task.reference_column(cfg.env)
    components = user_reward_components(
        cfg.reward, prompt_column=prompt_column, reference_column=reference_column, functions=rewards
    )
    if cfg.reward.model_path:
        import torch

        from grpo_rl.envs.rewards.reward_model import RewardModelScorer

        # The run's placement gives the reward model its device; an environment built without one (a test, a
        # notebook) scores on the CPU.
        device = devices.reward_model[0] if devices is not None and devices.reward_model else torch.device("cpu")
        rm = cfg.reward_model
        scorer = RewardModelScorer(
            cfg.reward.model_path,
            device,
            prompt_column=prompt_column,
            batch_size=rm.batch_size,
            max_length=rm.max_length,
            dtype=rm.dtype,
        )
        components.append(RewardComponent("model", scorer, cfg.reward.model_weight))
    return components


__all__ = [
    "PromptEnv",
    "PromptTooLongError",
    "group_answers",
    "make_env",
    "rewards_per_answer",
    "shared_reward_components",
]
