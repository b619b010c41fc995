"""Helpers the unit tests share: the project's config composed with overrides, a JSONL file, and a file task
scored on given answers."""

from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_dir
from tensordict import TensorDict

from grpo_rl.config.schema import register_configs
from grpo_rl.run.preflight import validate

ROOT = Path(__file__).resolve().parents[2]


def compose_config(overrides=()):
    """``config/grpo_gsm8k.yaml`` with Hydra ``overrides`` (not validated)."""
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "config"), version_base=None):
        return compose("grpo_gsm8k", overrides=list(overrides))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def file_env(tokenizer, data: Path, reward_path: Path, name: str, extra=()):
    """A validated ``env.dataset=file`` task on ``data`` scored by ``name`` in ``reward_path``, two prompts a step
    in file order."""
    from grpo_rl.envs import make_env

    cfg = compose_config(
        [
            "env.dataset=file",
            f"env.path={data}",
            f"reward.path={reward_path}",
            f"reward.name={name}",
            "env.prompts_per_step=2",
            "env.shuffle=false",
            *extra,
        ]
    )
    validate(cfg)  # loads the reward file (and recognises its convention)
    return make_env(cfg, tokenizer)


def score_answers(env, responses: list[str]):
    """Reset ``env`` and score ``responses`` (the same number for each prompt, in order); returns
    ``(prompts, next)``, ``next`` holding the rewards one row per answer (``[N, 1]``)."""
    from grpo_rl.envs import group_answers, rewards_per_answer

    prompts = env.reset()
    g = len(responses) // prompts.batch_size[0]
    nxt = env.step(prompts.clone(False).set("response_text", group_answers(responses, g)))["next"]
    return prompts, TensorDict({k: v.unsqueeze(-1) for k, v in rewards_per_answer(nxt).items()}, [len(responses)])
