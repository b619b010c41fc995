"""Environments: a prompt data set, a chat template and a reward, behind torchrl's reset/step contract.

``env.dataset`` picks the task: ``gsm8k`` (:mod:`.gsm8k`), ``ifeval`` (:mod:`.ifeval`) or ``file`` (a user's
prompts, :mod:`.custom`). Any task's own reward can be extended with the user's reward functions
(``reward.path``/``reward.name``, ``reward.functions``) and a reward model (``reward.model_path``); all
components are summed with their weights and logged one by one.
"""
from __future__ import annotations

from grpo_rl.data import load_records
from grpo_rl.envs.base import PromptEnv, PromptTooLongError
from grpo_rl.errors import ConfigError
from grpo_rl.rewards.base import RewardComponent
from grpo_rl.rewards.custom import UserReward, user_reward_components

# The column holding each row's raw prompt, per task, for a reward model.
_PROMPT_COLUMN = {"gsm8k": "question", "ifeval": "prompt"}


def make_env(cfg, tokenizer, *, split: str | None = None, devices=None, fewer_prompts_ok: bool = False) -> PromptEnv:
    """Build the environment that ``cfg.env.dataset`` names.

    Args:
        cfg: the run config.
        tokenizer: the policy's tokenizer (its chat template formats prompts).
        split: data split (default ``cfg.env.split``).
        devices: the run's :class:`~grpo_rl.devices.DeviceAllocation`; a reward model runs on its
            ``reward_model`` device. Default: allocated from ``cfg`` (only when a reward model is configured).
        fewer_prompts_ok: serve every prompt per step when the data has fewer than ``env.prompts_per_step``
            (held-out evaluation); by default that is an error, since a step would repeat prompts.

    Raises:
        ConfigError: ``env.prompts_per_step`` exceeds the prompts left after skipping over-long ones (unless
            ``fewer_prompts_ok``), or a reward function needs a column the data lacks.
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
        from grpo_rl.envs.custom import load_file_records, make_file_env

        env = make_file_env(cfg, load_file_records(cfg.env), tokenizer, seed=cfg.seed, components=extra)
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
    if env.prompts_per_step > len(env):
        if not fewer_prompts_ok:
            skipped = (f" ({env.num_skipped} more were skipped as longer than env.max_prompt_tokens="
                       f"{cfg.env.max_prompt_tokens})" if env.num_skipped else "")
            raise ConfigError(f"env.prompts_per_step={env.prompts_per_step} is more than the {len(env)} prompts in "
                              f"{env.name}{skipped}, so every step would repeat prompts; set env.prompts_per_step to "
                              f"at most {len(env)}, or add prompts to the data")
        env.prompts_per_step = len(env)
    return env


def shared_reward_components(cfg, devices=None) -> list[RewardComponent]:
    """The components any task can add: the user's reward functions and a reward model."""
    prompt_column = cfg.env.prompt_column if cfg.env.dataset == "file" else _PROMPT_COLUMN.get(cfg.env.dataset)
    reference_column = cfg.env.ground_truth_column if cfg.env.dataset == "file" else None
    components = user_reward_components(cfg.reward, prompt_column=prompt_column, reference_column=reference_column)
    if cfg.reward.model_path:
        from grpo_rl.rewards.reward_model import RewardModelScorer

        if devices is None or not devices.reward_model:
            from grpo_rl.devices import allocate_devices

            devices = allocate_devices(cfg, need_ref=cfg.policy.kl_coef > 0, need_reward_model=True)
        rm = cfg.reward_model
        scorer = RewardModelScorer(cfg.reward.model_path, devices.reward_model[0], prompt_column=prompt_column,
                                   batch_size=rm.batch_size, max_length=rm.max_length, dtype=rm.dtype)
        components.append(RewardComponent("model", scorer, cfg.reward.model_weight))
    return components


__all__ = ["PromptEnv", "PromptTooLongError", "make_env", "shared_reward_components"]
