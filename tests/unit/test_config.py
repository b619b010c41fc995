"""Tests for grpo_rl.config: Hydra composition against the schema, and ``validate``'s messages."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from grpo_rl.config import ConfigError, GRPOConfig, register_configs, validate

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


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
    assert cfg.train.epochs == 1
    assert cfg.ref_model.share_with_train is False


def test_readme_overrides_parse():
    cfg = _compose(["optimizer.lr=2e-5", "optimizer.weight_decay=0.01", "policy.kl_coef=0.1",
                    "train_model.devices=[0,1]"])
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

