"""Environments: a prompt data set, a chat template and a reward, behind torchrl's reset/step contract."""
from __future__ import annotations

from grpo_rl.data import load_records
from grpo_rl.envs.base import PromptEnv, PromptTooLongError


def make_env(cfg, tokenizer, *, split: str | None = None) -> PromptEnv:
    """Build the environment that ``cfg.env.dataset`` names."""
    split = split or cfg.env.split
    if cfg.env.dataset == "gsm8k":
        from grpo_rl.envs.gsm8k import make_gsm8k_env

        return make_gsm8k_env(cfg, load_records("gsm8k", split=split, path=cfg.env.path), tokenizer, seed=cfg.seed)
    raise ValueError(f"env.dataset={cfg.env.dataset!r} is not supported; choose gsm8k")


__all__ = ["PromptEnv", "PromptTooLongError", "make_env"]
