"""Environments: a prompt data set, a chat template and a reward, behind torchrl's reset/step contract.

``env.dataset`` picks the task: ``gsm8k`` (:mod:`.gsm8k`), ``ifeval`` (:mod:`.ifeval`) or ``file`` (a user's
prompts, :mod:`.custom`). Any task's own reward can be extended with the user's reward functions
(``reward.path``/``reward.name``, ``reward.functions``) and a reward model (``reward.model_path``); all
components are summed with their weights and logged one by one.
"""
from __future__ import annotations

from grpo_rl.data import load_records
from grpo_rl.envs.base import PromptEnv, PromptTooLongError
from grpo_rl.rewards.base import RewardComponent
from grpo_rl.rewards.custom import UserReward, user_reward_components

# The column holding each row's raw prompt, per task, for a reward model.
_PROMPT_COLUMN = {"gsm8k": "question", "ifeval": "prompt"}


def make_env(cfg, tokenizer, *, split: str | None = None, devices=None) -> PromptEnv:
    """Build the environment that ``cfg.env.dataset`` names.

    Args:
        cfg: the run config.
        tokenizer: the policy's tokenizer (its chat template formats prompts).
        split: data split (default ``cfg.env.split``).
        devices: the run's :class:`~grpo_rl.devices.DeviceAllocation`; a reward model runs on its
            ``reward_model`` device. Default: allocated from ``cfg`` (only when a reward model is configured).
    """
    split = split or cfg.env.split
    dataset = cfg.env.dataset
    extra = shared_reward_components(cfg, devices)
    if dataset == "gsm8k":
        from grpo_rl.envs.gsm8k import make_gsm8k_env

        env = make_gsm8k_env(cfg, load_records("gsm8k", split=split, path=cfg.env.path), tokenizer, seed=cfg.seed)
        env.reward.components.extend(extra)
        env.reward.fallback = cfg.reward.fallback
    elif dataset == "ifeval":
        from grpo_rl.envs.ifeval import make_ifeval_env

        env = make_ifeval_env(cfg, load_records("ifeval", split=split, path=cfg.env.path), tokenizer,
                              seed=cfg.seed, extra_components=extra)
    elif dataset == "file":
        from grpo_rl.envs.custom import make_file_env

        env = make_file_env(cfg, load_records("file", path=cfg.env.path), tokenizer, seed=cfg.seed, components=extra)
    else:
        raise ValueError(f"env.dataset={dataset!r} is not supported; choose gsm8k, ifeval or file")
    for comp in env.reward.components:
        if isinstance(comp.fn, UserReward):
            comp.fn.check_columns(env.extra_columns)
    names = [c.name for c in env.reward.components]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(f"reward components {clashes} would be logged under the same name; give your reward "
                         "functions distinct labels (reward.functions=[{path: ..., name: ..., label: ...}])")
    return env


def shared_reward_components(cfg, devices=None) -> list[RewardComponent]:
    """The components any task can add: the user's reward functions and a reward model."""
    components = user_reward_components(cfg.reward)
    if cfg.reward.model_path:
        from grpo_rl.rewards.reward_model import RewardModelScorer

        if devices is None or not devices.reward_model:
            from grpo_rl.devices import allocate_devices

            devices = allocate_devices(cfg, need_ref=cfg.policy.kl_coef > 0, need_reward_model=True)
        rm = cfg.reward_model
        prompt_column = cfg.env.prompt_column if cfg.env.dataset == "file" else _PROMPT_COLUMN[cfg.env.dataset]
        scorer = RewardModelScorer(cfg.reward.model_path, devices.reward_model[0], prompt_column=prompt_column,
                                   batch_size=rm.batch_size, max_length=rm.max_length, dtype=rm.dtype)
        components.append(RewardComponent("model", scorer, cfg.reward.model_weight))
    return components


__all__ = ["PromptEnv", "PromptTooLongError", "make_env", "shared_reward_components"]
