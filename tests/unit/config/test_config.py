"""Tests for grpo_rl.config.schema: Hydra composition against the schema, and ``validate``'s messages."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from grpo_rl.config import checks
from grpo_rl.config.checks import resolve_loss_type
from grpo_rl.config.schema import GRPOConfig, register_configs
from grpo_rl.errors import ConfigError
from grpo_rl.run.preflight import validate

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"


def _compose(overrides: list[str] = (), name: str = "grpo_gsm8k", config_dir: Path = CONFIG_DIR):
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(name, overrides=list(overrides))


def test_gsm8k_config_composes_and_validates():
    cfg = _compose()
    validate(cfg)
    assert cfg.env.dataset == "gsm8k"
    assert cfg.env.group_size == 8
    assert cfg.policy.clip_eps_high == 0.28
    assert cfg.optimizer.lr == pytest.approx(2e-5)
    assert isinstance(cfg.optimizer.lr, float)
    # keys the YAML leaves out come from the schema's defaults
    assert cfg.train.updates_per_batch == 1 and cfg.train.epochs is None and cfg.train.prompt_epochs is None
    assert cfg.ref_model.share_with_train is False


def test_readme_overrides_parse():
    cfg = _compose(
        ["optimizer.lr=2e-5", "optimizer.weight_decay=0.01", "policy.kl_coef=0.1", "train_model.devices=[0,1]"]
    )
    assert cfg.optimizer.lr == pytest.approx(2e-5)
    assert cfg.optimizer.weight_decay == pytest.approx(0.01)
    assert cfg.policy.kl_coef == pytest.approx(0.1)
    assert list(cfg.train_model.devices) == [0, 1]
    validate(cfg)


def test_unknown_key_override_fails():
    with pytest.raises(ConfigCompositionException, match="policy.kl_cof"):
        _compose(["policy.kl_cof=0.1"])


def test_misspelt_key_in_yaml_fails(tmp_path: Path):
    (tmp_path / "typo.yaml").write_text("defaults:\n  - grpo_schema\n  - _self_\npolicy:\n  kl_cof: 0.1\n")
    with pytest.raises(Exception, match="kl_cof"):
        _compose(name="typo", config_dir=tmp_path)


@pytest.mark.parametrize("override", ["optimizer.lr=abc", "env.group_size=1.5", "train_model.devices=gpu0"])
def test_wrong_type_fails_naming_the_key(override):
    with pytest.raises(ConfigCompositionException) as info:
        _compose([override])
    key = override.split("=")[0]
    assert key in str(info.value) + str(info.value.__cause__)


def test_structured_defaults_validate():
    validate(OmegaConf.structured(GRPOConfig))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["policy.aggregation=sum"], "policy.aggregation"),
        (["env.group_size=1"], "env.group_size"),
        (["optimizer.lr=-1e-5"], "optimizer.lr"),
        (["optimizer.lr=0"], "optimizer.lr"),
        (["env.max_prompt_tokens=900", "sampling.max_new_tokens=200"], "inference_model.max_model_len"),
        (["sampling.temperature=0"], "sampling.temperature"),
        (["env.dataset=file"], "env.path"),
        (["policy.kl_estimator=k4"], "policy.kl_estimator"),
        (["policy.clip_eps_low=1.0"], "policy.clip_eps_low"),
        (["policy.tis_cap=0.5"], "policy.tis_cap"),
        (["policy.loss_type=ppo"], "policy.loss_type"),
        (["policy.loss_type=dr_grpo", "policy.aggregation=token_mean"], "policy.aggregation"),
        (["policy.engine_correction=sequence"], "policy.engine_correction"),
        (["policy.engine_correction_min=1.5", "policy.tis_cap=1.2"], "policy.engine_correction_min"),
        (["policy.engine_correction_min=-0.1"], "policy.engine_correction_min"),
        (["policy.engine_correction_min=0.5", "policy.tis_cap=null"], "policy.engine_correction_min"),
        (["policy.entropy_coef=-0.01"], "policy.entropy_coef"),
        (["policy.advantage_eps=0"], "policy.advantage_eps"),
        (["policy.cispo_ratio_max=0.5"], "policy.cispo_ratio_max"),
        (["policy.cispo_ratio_min=2.0"], "policy.cispo_ratio_min"),
        (["policy.overlong_buffer=-1"], "policy.overlong_buffer"),
        (["sampling.max_new_tokens=128", "policy.overlong_buffer=128"], "policy.overlong_buffer"),
        (["policy.overlong_buffer=32", "policy.overlong_penalty=-0.5"], "policy.overlong_penalty"),
        (["policy.overlong_penalty=-1.0"], "policy.overlong_penalty"),  # checked even with the punishment off
        (["inference_model.engine=sglang"], "inference_model.engine"),
        (["train_model.num_devices=0"], "train_model.num_devices"),
    ],
)
def test_validate_names_the_bad_key(overrides, key):
    cfg = _compose(overrides)  # every one of these is well-typed, so composition succeeds
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_prompt_plus_answer_exactly_at_max_model_len_is_fine():
    validate(_compose(["env.max_prompt_tokens=824", "sampling.max_new_tokens=200"]))


@pytest.mark.parametrize(
    ("loss_type", "aggregation", "expected"),
    [
        ("grpo", None, ("grpo", "token_mean")),  # today's default, unchanged
        ("grpo", "seq_mean_token_mean", ("grpo", "seq_mean_token_mean")),  # TRL's loss_type=grpo
        ("dapo", None, ("grpo", "token_mean")),
        ("bnpo", None, ("grpo", "token_mean")),
        ("dr_grpo", None, ("grpo", "seq_mean_token_sum_norm")),
        ("dr_grpo", "seq_mean_token_sum_norm", ("grpo", "seq_mean_token_sum_norm")),  # agreeing is fine
        ("gspo", None, ("gspo", "seq_mean_token_mean")),  # the paper's mean over answers
        ("gspo", "token_mean", ("gspo", "token_mean")),
        ("gspo_token", None, ("gspo_token", "seq_mean_token_mean")),
        ("cispo", None, ("cispo", "token_mean")),
        ("sapo", None, ("sapo", "seq_mean_token_mean")),  # SAPO's and TRL's mean over answers
        ("gmpo", None, ("gmpo", "seq_mean_token_mean")),
    ],
)
def test_resolve_loss_type(loss_type, aggregation, expected):
    assert resolve_loss_type(loss_type, aggregation) == expected


def test_unknown_loss_type_lists_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        resolve_loss_type("ppo", None)
    for name in ("grpo", "gspo", "gspo_token", "cispo", "sapo", "gmpo", "dapo", "bnpo", "dr_grpo"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["policy.loss_type=dr_grpo"],
        ["policy.loss_type=gspo", "policy.clip_eps_low=3e-4", "policy.clip_eps_high=4e-4"],
        ["policy.loss_type=cispo", "policy.cispo_ratio_min=0.5"],
        ["policy.engine_correction=sequence_mask", "policy.engine_correction_min=0.5", "policy.tis_cap=3.0"],
        ["policy.entropy_coef=0.001", "policy.advantage_eps=1e-4"],
        [
            "policy.loss_type=dapo",
            "policy.overlong_buffer=32",
            "policy.overlong_penalty=0.5",
            "policy.overlong_filter=true",
        ],
        ["sampling.max_new_tokens=128", "policy.overlong_buffer=127", "policy.overlong_penalty=0"],  # the widest buffer
        ["policy.loss_type=sapo", "policy.sapo_temperature_pos=1.0", "policy.sapo_temperature_neg=1.05"],
        ["policy.loss_type=gmpo", "policy.gmpo_clip_eps=0.4"],
        [
            "policy.engine_correction=token_band_mask",
            "policy.engine_correction_min=0.5",
            "policy.engine_correction_max=5.0",
        ],
        [
            "policy.engine_correction=sequence_band_mask",
            "policy.engine_correction_min=0.99",
            "policy.engine_correction_max=1.01",
        ],
    ],
)
def test_new_policy_settings_compose_and_validate(overrides):
    cfg = _compose(overrides)
    validate(cfg)
    assert cfg.policy.aggregation is None  # the YAML leaves it to the loss type


@pytest.mark.parametrize("mode", ["token_band_mask", "sequence_band_mask"])
@pytest.mark.parametrize("bounds", [[], ["policy.engine_correction_min=0.5"], ["policy.engine_correction_max=5.0"]])
def test_band_mode_without_both_bounds_is_a_one_line_error(mode, bounds):
    with pytest.raises(ConfigError) as info:
        validate(_compose([f"policy.engine_correction={mode}", *bounds]))
    message = str(info.value)
    assert "\n" not in message
    assert f"policy.engine_correction={mode}" in message
    assert "policy.engine_correction_min and policy.engine_correction_max" in message and "0.5 and 5.0" in message


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["policy.engine_correction_max=5.0"], "bounds only token_band_mask"),  # token_truncate's bound is tis_cap
        (
            [
                "policy.engine_correction=token_band_mask",
                "policy.engine_correction_min=0.5",
                "policy.engine_correction_max=0.9",
            ],
            r"policy\.engine_correction_max=0\.9 must be",
        ),
        (
            [
                "policy.engine_correction=sequence_band_mask",
                "policy.engine_correction_min=0.5",
                "policy.engine_correction_max=5.0",
                "policy.tis_cap=null",
            ],
            "band modes do not use its value",
        ),
        (["policy.sapo_temperature_pos=0"], r"policy\.sapo_temperature_pos"),
        (["policy.sapo_temperature_neg=-1"], r"policy\.sapo_temperature_neg"),
        (["policy.gmpo_clip_eps=0"], r"policy\.gmpo_clip_eps"),
    ],
)
def test_new_objective_settings_are_checked(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(_compose(overrides))


def test_overlong_settings_default_off():
    policy = _compose().policy
    assert (policy.overlong_buffer, policy.overlong_penalty, policy.overlong_filter) == (0, 1.0, False)


def test_overlong_buffer_over_the_limit_says_what_to_set():
    cfg = _compose(["sampling.max_new_tokens=100", "policy.overlong_buffer=100"])
    with pytest.raises(
        ConfigError, match=r"policy\.overlong_buffer=100 must be < sampling\.max_new_tokens=100"
    ) as info:
        validate(cfg)
    assert "policy.overlong_buffer=20" in str(info.value)  # DAPO's fifth of the limit, as a ready override


def test_train_epochs_is_the_old_name_of_updates_per_batch(monkeypatch):
    # The checks' own logger, replaced: an earlier test's logging set-up (a library's dictConfig) must not decide this.
    log = mock.Mock()
    monkeypatch.setattr(checks, "log", log)
    cfg = _compose(["train.epochs=3"])
    validate(cfg)
    assert (cfg.train.updates_per_batch, cfg.train.epochs) == (3, None)  # one key from here on
    warnings = [call.args[0] % call.args[1:] for call in log.warning.call_args_list]
    assert len(warnings) == 1 and "train.updates_per_batch=3" in warnings[0]
    log.reset_mock()
    validate(cfg)  # validated again (a resumed config, an actor's copy): no second warning
    assert not log.warning.called
    validate(_compose(["train.epochs=2", "train.updates_per_batch=2"]))  # the same value under both names


def test_train_epochs_conflicting_with_updates_per_batch_is_an_error():
    with pytest.raises(ConfigError, match=r"train\.epochs=3 and train\.updates_per_batch=2: .*drop train\.epochs"):
        validate(_compose(["train.epochs=3", "train.updates_per_batch=2"]))
    for override, key in (("train.updates_per_batch=0", "train.updates_per_batch"), ("train.epochs=0", "train.epochs")):
        with pytest.raises(ConfigError, match=rf"{key}=0 must be > 0"):
            validate(_compose([override]))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_prompt_epochs_must_be_positive(value):
    with pytest.raises(ConfigError, match=r"train\.prompt_epochs=\S+ must be > 0"):
        validate(_compose([f"train.prompt_epochs={value}"]))
    validate(_compose(["train.prompt_epochs=0.5"]))
