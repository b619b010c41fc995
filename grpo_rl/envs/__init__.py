"""Environments: a prompt data set, a chat template and a reward, as torchrl environments (:mod:`.base`).

``env.dataset`` picks the task, a room of :mod:`.tasks`: ``gsm8k``, ``ifeval``, ``arithmetic`` (generated
problems scored as GSM8K) or ``file`` (a user's prompts). Any
task's own reward can be extended with the user's reward functions (``reward.path``/``reward.name``,
``reward.functions``) and a reward model (``reward.model_path``); all components are summed with their weights and
logged one by one, and the sum is shifted and scaled, ``(sum + reward.bias) * reward.scale``, before advantages.

The package holds the tasks: environments, data loading (:mod:`.data`), rewards (:mod:`.rewards`), tools
(:mod:`.tools`) and multi-turn episodes (:mod:`.multiturn`). May import :mod:`grpo_rl.engines` and below (an
episode drives an engine through its protocol).
"""
from __future__ import annotations

from typing import Sequence

from grpo_rl.envs.data import load_records
from grpo_rl.envs.base import PromptEnv, PromptTooLongError, group_answers, rewards_per_answer
from grpo_rl.errors import ConfigError
from grpo_rl.envs.rewards.base import RewardComponent
from grpo_rl.envs.rewards.custom import RewardFunction, UserReward, user_reward_components

# The column holding each row's raw prompt, per task, for a reward model.
_PROMPT_COLUMN = {"gsm8k": "question", "ifeval": "prompt", "arithmetic": "question"}


def make_env(cfg, tokenizer, *, split: str | None = None, devices=None, fewer_prompts_ok: bool = False,
             rewards: Sequence[RewardFunction] = ()) -> PromptEnv:
    """Build the environment that ``cfg.env.dataset`` names.

    Args:
        cfg: the run config.
        tokenizer: the policy's tokenizer (its chat template formats prompts).
        split: data split (default ``cfg.env.split``).
        devices: the run's :class:`~grpo_rl.placement.devices.DeviceAllocation`; a reward model runs on its
            ``reward_model`` device. Default: allocated from ``cfg`` (only when a reward model is configured).
        fewer_prompts_ok: serve every prompt per step when the data has fewer than ``env.prompts_per_step``
            (held-out evaluation); by default that is an error, since a step would repeat prompts.
        rewards: reward functions given as Python objects (the Python API's ``rewards``), added to the configured
            ones.

    With ``env.tools``, the system prompt gets the tools' descriptions and the call format, and the environment's
    ``tool_use`` (:class:`~grpo_rl.envs.multiturn.ToolUse`, else None) answers the calls of multi-turn episodes.

    Raises:
        ConfigError: ``env.prompts_per_step`` exceeds the prompts left after skipping over-long ones (unless
            ``fewer_prompts_ok``), or a reward function needs a column the data lacks.
    """
    split = split or cfg.env.split
    tool_use = None
    if cfg.env.tools:
        cfg, tool_use = _with_tools(cfg, tokenizer)
    dataset = cfg.env.dataset
    extra = shared_reward_components(cfg, devices, rewards)
    if dataset == "gsm8k":
        from grpo_rl.envs.tasks.gsm8k.env import make_gsm8k_env

        env = make_gsm8k_env(cfg, load_records("gsm8k", split=split, path=cfg.env.path), tokenizer, seed=cfg.seed,
                             extra_components=extra)
    elif dataset == "ifeval":
        from grpo_rl.envs.tasks.ifeval.env import make_ifeval_env

        env = make_ifeval_env(cfg, load_records("ifeval", split=split, path=cfg.env.path), tokenizer,
                              seed=cfg.seed, extra_components=extra)
    elif dataset == "arithmetic":
        from grpo_rl.envs.tasks.arithmetic.problems import make_arithmetic_env

        env = make_arithmetic_env(cfg, tokenizer, split=split, extra_components=extra)
    elif dataset == "file":
        from grpo_rl.envs.tasks.file.env import load_file_records, make_file_env

        env = make_file_env(cfg, load_file_records(cfg.env, split), tokenizer, seed=cfg.seed, components=extra)
    else:
        raise ValueError(f"env.dataset={dataset!r} is not supported; choose gsm8k, ifeval, arithmetic or file")
    env.tool_use = tool_use
    env.reward.scale, env.reward.bias = cfg.reward.scale, cfg.reward.bias
    env.update_specs()  # a reward_unscaled key when the scale or bias changes the sum
    for comp in env.reward.components:
        if isinstance(comp.fn, UserReward):
            comp.fn.check_columns(env.extra_columns)
    names = [c.name for c in env.reward.components]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(f"reward components {clashes} would be logged under the same name; give your reward "
                         "functions distinct labels (reward.functions=[{path: ..., name: ..., label: ...}])")
    if env.prompts_per_step > len(env):
        if not fewer_prompts_ok:
            skipped = (f" ({env.num_skipped} more were skipped as longer than env.max_prompt_tokens="
                       f"{cfg.env.max_prompt_tokens})" if env.num_skipped else "")
            raise ConfigError(f"env.prompts_per_step={env.prompts_per_step} is more than the {len(env)} prompts in "
                              f"{env.name}{skipped}, so every step would repeat prompts; set env.prompts_per_step to "
                              f"at most {len(env)}, or add prompts to the data")
        env.prompts_per_step = len(env)
    return env


def _with_tools(cfg, tokenizer):
    """``cfg`` with the tools' system prompt (after the task's own, or ``env.system_prompt``), and the tools.

    Raises:
        ConfigError: the tokenizer's chat template cannot render a tool message (checked here, before any engine).
    """
    import copy

    from grpo_rl.envs.multiturn import ToolMessages, ToolUse

    try:
        ToolMessages(tokenizer)
    except ValueError as e:
        raise ConfigError(f"env.tools: {e} (model.name={cfg.model.name}); use a model whose chat template has a tool "
                          "role, or train without env.tools") from e
    from grpo_rl.envs.tools.configured import configured_tools
    from grpo_rl.envs.tools.format import tool_system_prompt

    tools = configured_tools(cfg.env.tools)
    base = cfg.env.system_prompt
    if base is None and cfg.env.dataset in ("gsm8k", "arithmetic"):
        from grpo_rl.envs.tasks.gsm8k.env import SYSTEM_PROMPTS

        base = SYSTEM_PROMPTS[cfg.env.template]
    elif base is None and cfg.env.dataset == "ifeval" and cfg.reward.ifeval_answer_tags:
        from grpo_rl.envs.tasks.ifeval.env import ANSWER_TAGS_SYSTEM_PROMPT

        base = ANSWER_TAGS_SYSTEM_PROMPT
    cfg = copy.deepcopy(cfg)
    cfg.env.system_prompt = "\n\n".join(p for p in (base, tool_system_prompt(list(tools.values()))) if p)
    return cfg, ToolUse(tools, max_chars=cfg.env.tool_reply_chars)


def shared_reward_components(cfg, devices=None, rewards: Sequence[RewardFunction] = ()) -> list[RewardComponent]:
    """The components any task can add: the user's reward functions (files, then ``rewards``) and a reward
    model."""
    prompt_column = cfg.env.prompt_column if cfg.env.dataset == "file" else _PROMPT_COLUMN.get(cfg.env.dataset)
    reference_column = cfg.env.ground_truth_column if cfg.env.dataset == "file" else None
    components = user_reward_components(cfg.reward, prompt_column=prompt_column, reference_column=reference_column,
                                        functions=rewards)
    if cfg.reward.model_path:
        import torch

        from grpo_rl.envs.rewards.reward_model import RewardModelScorer

        # The run's placement gives the reward model its device; an environment built without one (a test, a
        # notebook) scores on the CPU.
        device = devices.reward_model[0] if devices is not None and devices.reward_model else torch.device("cpu")
        rm = cfg.reward_model
        scorer = RewardModelScorer(cfg.reward.model_path, device, prompt_column=prompt_column,
                                   batch_size=rm.batch_size, max_length=rm.max_length, dtype=rm.dtype)
        components.append(RewardComponent("model", scorer, cfg.reward.model_weight))
    return components


__all__ = ["PromptEnv", "PromptTooLongError", "group_answers", "make_env", "rewards_per_answer",
           "shared_reward_components"]
