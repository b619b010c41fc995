"""Tests for grpo_rl.config.torchrl_keys: TorchRL's env.num_envs, train.total_dialog_turns and train.optim_batch_size
mapped onto env.prompts_per_step, train.steps and train.micro_batch_tokens, with hand-computed values.

The schema's defaults: 4 prompts x 8 answers a step, prompts up to 320 tokens, answers up to 160, a 1024-token
engine context, train.share_prompt=true.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from grpo_rl.api import compose
from grpo_rl.config.checks import check_values
from grpo_rl.config.schema import GRPOConfig
from grpo_rl.config.torchrl_keys import describe_torchrl_keys, override_keys, resolve_torchrl_keys
from grpo_rl.errors import ConfigError


def _cfg(**settings):
    """The schema's defaults with ``settings`` as ``{"train.steps": 5}``-style dotted keys."""
    return OmegaConf.merge(
        OmegaConf.structured(GRPOConfig),
        OmegaConf.from_dotlist([f"{k}={'null' if v is None else v}" for k, v in settings.items()]),
    )


def test_nothing_set_changes_nothing():
    cfg = _cfg()
    resolve_torchrl_keys(cfg, given=())
    assert (cfg.env.prompts_per_step, cfg.train.steps, cfg.train.micro_batch_tokens) == (4, 30, 4096)
    assert describe_torchrl_keys(cfg) == []


def test_num_envs_sets_prompts_per_step():
    cfg = _cfg(**{"env.num_envs": 48})
    resolve_torchrl_keys(cfg, given=())
    assert cfg.env.prompts_per_step == 6  # 48 answers / 8 per prompt


def test_total_dialog_turns_sets_steps():
    cfg = _cfg(**{"train.total_dialog_turns": 960})
    resolve_torchrl_keys(cfg, given=())
    assert cfg.train.steps == 30  # 960 answers / (4 x 8)


def test_total_dialog_turns_counts_the_batch_num_envs_sets():
    cfg = _cfg(**{"env.num_envs": 16, "train.total_dialog_turns": 960})
    resolve_torchrl_keys(cfg, given=())
    assert cfg.env.prompts_per_step == 2  # 16 / 8
    assert cfg.train.steps == 60  # 960 / 16


def test_optim_batch_size_sets_micro_batch_tokens():
    cfg = _cfg(**{"train.optim_batch_size": 8})
    resolve_torchrl_keys(cfg, given=())
    assert cfg.train.micro_batch_tokens == 3840  # 8 x (320 + 160)


def test_optim_batch_size_multi_turn_uses_the_engine_context():
    cfg = _cfg(**{"train.optim_batch_size": 8, "env.max_turns": 3})
    resolve_torchrl_keys(cfg, given=())
    assert cfg.train.micro_batch_tokens == 8192  # 8 x 1024


def test_optim_batch_size_below_a_group_needs_unshared_prompts():
    with pytest.raises(ConfigError, match=r"train.optim_batch_size=4 .*env.group_size=8.*train.share_prompt=false"):
        resolve_torchrl_keys(_cfg(**{"train.optim_batch_size": 4}), given=())
    cfg = _cfg(**{"train.optim_batch_size": 4, "train.share_prompt": False})
    resolve_torchrl_keys(cfg, given=())
    assert cfg.train.micro_batch_tokens == 1920  # 4 x 480


def test_a_value_from_a_yaml_is_replaced_one_given_explicitly_must_agree():
    cfg = _cfg(**{"train.total_dialog_turns": 960, "train.steps": 200})
    resolve_torchrl_keys(cfg, given=())  # train.steps from a config file: replaced
    assert cfg.train.steps == 30
    cfg = _cfg(**{"train.total_dialog_turns": 960, "train.steps": 30})
    resolve_torchrl_keys(cfg, given={"train.steps"})  # given, and it agrees
    assert cfg.train.steps == 30
    cfg = _cfg(**{"train.total_dialog_turns": 960, "train.steps": 50})
    with pytest.raises(ConfigError) as info:
        resolve_torchrl_keys(cfg, given={"train.steps", "train.total_dialog_turns"})
    assert str(info.value) == (
        "train.total_dialog_turns=960 gives train.steps=30 (960 answers / 32 a step), but "
        "train.steps=50 is given too; drop one of them, or make them agree"
    )


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"env.num_envs": 16, "env.prompts_per_step": 4}, "env.prompts_per_step"),  # 16 / 8 = 2
        ({"train.optim_batch_size": 8, "train.micro_batch_tokens": 4096}, "train.micro_batch_tokens"),  # 3840
    ],
)
def test_each_mapped_setting_given_otherwise_is_an_error(settings, key):
    with pytest.raises(ConfigError, match=f"but {key}="):
        resolve_torchrl_keys(_cfg(**settings), given=set(settings))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"train.total_dialog_turns": 1000}, "use train.total_dialog_turns=992 or 1024"),  # 31 or 32 steps of 32
        ({"train.total_dialog_turns": 20}, "use train.total_dialog_turns=32"),  # less than one step
        ({"env.num_envs": 30}, "use env.num_envs=24 or 32"),
        ({"env.num_envs": 4}, "use env.num_envs=8,"),
        ({"env.num_envs": 0}, "env.num_envs=0 must be >= 1"),
        ({"train.optim_batch_size": -1}, "train.optim_batch_size=-1 must be >= 1"),
        ({"train.total_dialog_turns": 960, "train.prompt_epochs": 2}, "both set the run's length"),
    ],
)
def test_values_that_cannot_be_mapped_name_the_fix(settings, message):
    with pytest.raises(ConfigError, match=message):
        resolve_torchrl_keys(_cfg(**settings), given=())


def test_resolving_twice_changes_nothing_more():
    cfg = _cfg(**{"env.num_envs": 16, "train.total_dialog_turns": 960, "train.optim_batch_size": 8})
    resolve_torchrl_keys(cfg, given=())
    first = OmegaConf.to_container(cfg)
    resolve_torchrl_keys(cfg, given={"env.prompts_per_step", "train.steps", "train.micro_batch_tokens"})
    assert OmegaConf.to_container(cfg) == first


def test_start_up_lines_say_what_each_key_became():
    cfg = _cfg(**{"env.num_envs": 16, "train.total_dialog_turns": 960, "train.optim_batch_size": 8})
    resolve_torchrl_keys(cfg, given=())
    assert describe_torchrl_keys(cfg) == [
        "env.num_envs=16 -> env.prompts_per_step=2 (16 answers generated together, env.group_size=8 per prompt)",
        "train.total_dialog_turns=960 -> train.steps=60 (960 answers, 2 prompts x 8 a step)",
        "train.optim_batch_size=8 -> train.micro_batch_tokens=3840 (answers of up to 480 tokens, "
        "env.max_prompt_tokens=320 + sampling.max_new_tokens=160)",
    ]


def test_override_keys():
    assert override_keys(["train.steps=5", "+a.b=1", "++c.d=x=y", "~e.f"]) == {"train.steps", "a.b", "c.d", "e.f"}


def test_check_values_checks_them_and_writes_nothing():
    cfg = _cfg(**{"env.num_envs": 16, "train.total_dialog_turns": 960, "train.optim_batch_size": 8})
    with pytest.raises(
        ConfigError,
        match=r"env.num_envs=16 gives env.prompts_per_step=2 .* holds "
        r"env.prompts_per_step=4: the TorchRL keys were not resolved",
    ):
        check_values(cfg)  # not derived: the checks say so, and set nothing
    assert (cfg.env.prompts_per_step, cfg.train.steps, cfg.train.micro_batch_tokens) == (4, 30, 4096)
    resolve_torchrl_keys(cfg, given=())  # what make_run does before the checks
    derived = OmegaConf.to_container(cfg)
    check_values(cfg)
    assert OmegaConf.to_container(cfg) == derived  # the checks only check
    assert (cfg.env.prompts_per_step, cfg.train.steps, cfg.train.micro_batch_tokens) == (2, 60, 3840)
    with pytest.raises(ConfigError, match="env.num_envs=30 is not a multiple"):
        check_values(_cfg(**{"env.num_envs": 30}))  # a key that cannot be mapped: the checks name the fix too


def test_compose_refuses_an_override_that_contradicts_one():
    assert compose(overrides=["train.total_dialog_turns=3200"]).train.steps == 100  # grpo_gsm8k: 4 x 8 a step
    with pytest.raises(ConfigError, match="train.total_dialog_turns=3200 gives train.steps=100"):
        compose(overrides=["train.total_dialog_turns=3200", "train.steps=50"])
